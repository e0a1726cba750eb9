#!/usr/bin/env bash
# The cgroups the cgroup tests run in (tests/runs/test_cgroups.py): made for one
# test run, named in env vars, removed at its end. One recipe for CI and for a
# local run:
#   .ci/run sources it:   . tests/cgroups.sh; sessiond_cgroups_create NAME; trap sessiond_cgroups_remove EXIT
#   locally (as root):    tests/cgroups.sh .venv/bin/pytest tests/runs -q
#
# SESSIOND_TEST_CGROUP2      a folder made under the machine's cgroup2 mount
#                            (unset where there is none, or it cannot be made)
# SESSIOND_TEST_PIDS_CGROUP  a folder made in the cgroup v1 pids hierarchy, or ""
#                            where the machine has none
# Only these folders are made, and only the processes inside them are killed.

sessiond_cgroups_made=()

sessiond_cgroups_create() {
    local name=$1 v2 v1
    # /proc/mounts: device mountpoint fstype options ...
    v2=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
    v1=$(awk '$3 == "cgroup" && $4 ~ /(^|,)pids(,|$)/ { print $2; exit }' /proc/mounts)
    unset SESSIOND_TEST_CGROUP2
    if [ -n "$v2" ]; then
        if mkdir "$v2/$name"; then
            sessiond_cgroups_made+=("$v2/$name")
            # Our own folder may hand pids on to the tests' groups (it holds no process).
            if grep -qw pids "$v2/$name/cgroup.controllers"; then
                echo +pids > "$v2/$name/cgroup.subtree_control" ||
                    echo "cgroups.sh: cannot enable pids in $v2/$name" >&2
            fi
            export SESSIOND_TEST_CGROUP2="$v2/$name"
        else
            echo "cgroups.sh: cannot make $v2/$name (root, or a delegated cgroup, is needed)" >&2
        fi
    fi
    export SESSIOND_TEST_PIDS_CGROUP=""
    if [ -n "$v1" ]; then
        if mkdir "$v1/$name"; then
            sessiond_cgroups_made+=("$v1/$name")
            export SESSIOND_TEST_PIDS_CGROUP="$v1/$name"
        else
            echo "cgroups.sh: cannot make $v1/$name" >&2
        fi
    fi
}

# Kill what is inside one group (never anything else), and wait until it is empty.
sessiond_cgroups_empty() {
    local dir=$1 pid tries=0
    # (cgroup files report a size of 0: read them, do not test -s)
    while [ -n "$(cat "$dir/cgroup.procs" 2>/dev/null)" ]; do
        if [ -e "$dir/cgroup.kill" ]; then
            echo 1 > "$dir/cgroup.kill"
        else
            while read -r pid; do kill -9 "$pid" 2>/dev/null; done < "$dir/cgroup.procs"
        fi
        tries=$((tries + 1))
        if [ "$tries" -gt 200 ]; then
            echo "cgroups.sh: $dir still has processes: $(tr '\n' ' ' < "$dir/cgroup.procs")" >&2
            return 1
        fi
        sleep 0.05  # a killed process takes a moment to exit; bounded by the count above
    done
}

sessiond_cgroups_remove() {
    local top dir
    for top in "${sessiond_cgroups_made[@]}"; do
        [ -d "$top" ] || continue
        # Deepest first: what the tests left below their folders, then the folder.
        while read -r dir; do
            sessiond_cgroups_empty "$dir" || true  # said why; try the rest
            rmdir "$dir" || echo "cgroups.sh: cannot remove $dir" >&2
        done < <(find "$top" -depth -type d)
    done
    sessiond_cgroups_made=()
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -uo pipefail
    if [ $# -eq 0 ]; then
        echo "usage: tests/cgroups.sh COMMAND [ARG...]   (runs COMMAND with the test cgroups)" >&2
        exit 2
    fi
    sessiond_cgroups_create "sessiond-test-$$"
    trap sessiond_cgroups_remove EXIT
    "$@"
fi
