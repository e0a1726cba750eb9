"""The truth: events and their payloads, the line codec, the stores behind one
interface, replay (a pure fold), projections, lineage, bundles, fsck.

Nothing here knows about processes, triggers or the socket: everything above reads
and appends through this package."""
