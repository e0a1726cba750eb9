#!/bin/sh
# One program for both sides of a hand-off; $SESSIOND_SESSION says which side.
# The daemon gives every program SESSIOND_SOCKET (its program endpoint) and
# SESSIOND_TOKEN, so sessionctl finds it and says which run is calling.
set -eu
ctl() { "${SESSIONCTL:-sessionctl}" "$@"; }
if [ "$SESSIOND_SESSION" = "handoff" ]; then
    case "$SESSIOND_WAKE" in
    *'"trigger":"message"'*'"sender":"handoff-side"'*)
        # the child reported back: take its result into this session
        ctl merge handoff-side --summary "side quest: $(cat side-result.txt)"
        echo "merged the side quest" ;;
    *)
        # Start a side quest in a child session that begins with this one's
        # history. Forked in the middle of this turn, the child goes on with it, as
        # a forked process goes on from where its parent was: once woken, it runs
        # this program again, as handoff-side (the branch below). `activate` wakes
        # it, and that one run is its whole part. (A message would wake it too, but
        # as work of its own: a second run, after the one that goes on with this
        # turn, and a second "done".)
        ctl fork handoff --as handoff-side --with-triggers
        ctl activate handoff-side
        echo "forked handoff-side" ;;
    esac
else
    # the child: do the side quest, then send the result back to the parent
    grep -c "http" links.txt > side-result.txt || true
    echo "$(cat side-result.txt) links checked" > side-result.txt
    ctl send handoff "done: $(cat side-result.txt)" --from handoff-side
fi
