#!/bin/sh
# One-shot set-up of the keys the two-site example's workers read
# (deploy/sites/compose.sites.yaml), run by its "keys" service. It makes
# what is missing and keeps what exists.
#
#   operator.key/.pub     ed25519: the operator's document key, which signs
#                         the hub's upgrade record (steward setup)
#   controller.key/.pub   ed25519: the controller signs credential.rotated;
#                         every site's credential workers verify with
#                         controller.pub
#   <hive>.key/.pub       age: each hive's identity and recipient
#   credential-<hive>.key/.pub  ed25519: each instance's document key, which
#                         signs its checkpoints, outcomes and dead letters
#                         (docs/design.md §7), in its site's domain
set -eu
dir=${KEYS_DIR:?KEYS_DIR names the folder to write the keys to}
umask 077
mkdir -p "$dir"

key() {
  if [ -e "$dir/$2.key" ] || [ -e "$dir/$2.pub" ]; then
    echo "keys: $2 exists, kept"
    return
  fi
  steward keys --dir "$dir" --kind "$1" --name "$2"
}
key ed25519 operator
key controller controller
for hive in ${HIVES:?HIVES lists the hives of every site, separated by spaces}; do
  key age "$hive"
  key ed25519 "credential-$hive"
done
