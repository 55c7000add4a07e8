#!/bin/sh
# One-shot set-up of the keys compose's Steward services read: run by the
# "keys" service before any worker starts. It makes what is missing and
# keeps what exists, so `docker compose up` can run it every time.
#
#   console.key/.pub   ed25519: the console signs invitations (join)
#   release.key/.pub   ed25519: the release pipeline signs host floors (join)
#   cosign.key/.pub    ECDSA P-256: the release pipeline signs manifests (converge);
#                      cosign.key is in cosign's own encrypted format (sealed with
#                      $COSIGN_PASSWORD, empty if unset), so `cosign sign-blob --key`
#                      takes it as it is
#   hive.key/.pub      age: the credential worker's hive identity and recipient
#   machine.key/.pub   age: the provision worker's machine identity and recipient
#   ingress-token      the bearer token of the HTTP ingress (steward serve)
#
# The private signing keys are here so a newcomer can sign events at once;
# in production they stay with the console and the release pipeline, and
# only the .pub files are given to the workers.
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
key ed25519 console
key ed25519 release
key ecdsa-p256 cosign
key age hive
key age machine

if [ ! -s "$dir/ingress-token" ]; then
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/ingress-token.tmp"
  mv -f "$dir/ingress-token.tmp" "$dir/ingress-token"
  echo "keys: ingress-token written"
fi
