"""A daemon as a node of a cluster: its parts, made in the order they are needed.

The kernel's seams (placement, ``migrate --node``/``drain``, mail) exist before
the kernel, which receives them at its construction; the forwarding of requests
exists before the dispatches and the console, which receive it as their router
at theirs. Each acts once :meth:`ClusterNode.start` has given it the daemon:
until then a node answers as one machine (its table is being loaded). The parts
reach the other nodes only through the channels (sessiond.cluster.channels)
that ``lease.make_store`` made with the store and the coordination; the broker
listens from :meth:`ClusterNode.start` on, and stops after the parts. Imported
only when ``[cluster] dsn`` is set (psycopg: the ``cluster`` extra).
"""

from __future__ import annotations

from sessiond.cluster.forward import Forward
from sessiond.cluster.host import Host, Node
from sessiond.cluster.lease import LeaseKeeper
from sessiond.cluster.mailbox import Mailbox
from sessiond.ipc.dispatch import Dispatch
from sessiond.syscalls.seams import Seams


class ClusterNode:
    def __init__(self, keeper: LeaseKeeper) -> None:
        self.keeper = keeper
        self.channels = keeper.channels
        # ``send`` to a session another node runs (and its delivery here)
        self.mailbox = Mailbox(keeper.store, self.channels.mail, self.channels.broker)
        self.seams = Seams(placement=keeper.placer, nodes=keeper, mail=self.mailbox)

    def forwarding(self, host: Host) -> Forward:
        """The router of this node's dispatches and console: any node's socket
        serves the whole cluster (made once the kernel is)."""
        return Forward(self.keeper, host, self.channels)

    def start(self, node: Node, forward: Forward, dispatch: Dispatch) -> None:
        """From now on: take over what dead nodes leave and serve ``migrate --node``
        and ``drain``; deliver the messages left for this node's sessions; answer
        the requests other nodes carry here, through ``dispatch``."""
        self.keeper.take_over(node)
        self.mailbox.start(node.table, node.kernel.lineage.deliver)
        forward.start(dispatch)
        # after the parts subscribed: each hears that it listens, and looks
        self.channels.broker.start()

    async def close(self, forward: Forward | None) -> None:
        """At a clean stop: stop carrying and delivering, then let go of the lease."""
        if forward is not None:
            await forward.close()
        self.mailbox.close()
        await self.channels.broker.close()
        await self.keeper.close()
