#!/bin/sh
# Stand-in for the host guard's arm command, for compose and the e2e tests.
#
# The join worker runs it as: <cmd> -policy P -identity I -enrollment E,
# without a shell, with the worker's environment. A real guard arms itself
# here; this stand-in checks that the three files are readable and writes
# the armed marker ($STEWARD_ARMED_MARKER, the join worker's own setting)
# with the enrollment's content, atomically, as the guard would.
set -eu
policy='' identity='' enrollment=''
while [ $# -gt 0 ]; do
  case "$1" in
    -policy) policy=$2; shift 2 ;;
    -identity) identity=$2; shift 2 ;;
    -enrollment) enrollment=$2; shift 2 ;;
    *) echo "arm: unknown argument $1" >&2; exit 2 ;;
  esac
done
for f in "$policy" "$identity" "$enrollment"; do
  [ -r "$f" ] || { echo "arm: cannot read '$f'" >&2; exit 2; }
done
marker=${STEWARD_ARMED_MARKER:?arm: STEWARD_ARMED_MARKER is not set}
cp "$enrollment" "$marker.tmp.$$"
mv -f "$marker.tmp.$$" "$marker"
echo "arm: armed with $enrollment"
