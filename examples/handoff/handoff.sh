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
        # start a side quest in a child session that begins with this one's history
        ctl fork handoff --as handoff-side --with-triggers
        ctl send handoff-side "check the links in docs/" --from handoff
        echo "forked handoff-side" ;;
    esac
else
    # the child: do the side quest, then send the result back to the parent
    grep -c "http" links.txt > side-result.txt || true
    echo "$(cat side-result.txt) links checked" > side-result.txt
    ctl send handoff "done: $(cat side-result.txt)" --from handoff-side
fi
