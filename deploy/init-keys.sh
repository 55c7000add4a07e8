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
#   controller.key/.pub ed25519: the controller signs credential.rotated and
#                      grant.changed (the ingress signs with controller.key for
#                      its authenticated callers); the credential and provision
#                      workers verify with controller.pub
#   hive.key/.pub      age: the credential worker's hive identity and recipient
#   machine.key/.pub   age: the provision worker's machine identity and recipient
#   ingress-token      the bearer token of the HTTP ingress (steward serve): it
#                      publishes what needs no signature
#   scoped-token       a token the ingress signs rotations and grants for, for
#                      this compose's hive and machine only (tokens/, documents
#                      signed by the operator's document key)
#   nats/              the bus's authority (steward creds init): operator, account and
#                      signing key seeds (0600), and one credentials file per
#                      identity: operator.creds (the setup service), publisher.creds
#                      (the ingress) and <worker>.creds, scoped to its instance
#   $NATS_SERVER_DIR   what the NATS server reads (operator.jwt, accounts/): no seed
#
# The private signing keys are here so a newcomer can sign events at once;
# in production they stay with the console, the release pipeline and the
# controller (or the ingress that signs for it), and only the .pub files are
# given to the workers.
set -eu
dir=${KEYS_DIR:?KEYS_DIR names the folder to write the keys to}
server_dir=${NATS_SERVER_DIR:?NATS_SERVER_DIR names the folder the NATS server reads its trust from}
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
key controller controller
key age hive
key age machine

if [ ! -s "$dir/ingress-token" ]; then
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/ingress-token.tmp"
  mv -f "$dir/ingress-token.tmp" "$dir/ingress-token"
  echo "keys: ingress-token written"
fi

# The bus is closed: NATS trusts the authority made here, and each service
# connects with its own credentials (STEWARD_NATS_CREDS). A credentials
# file that exists is kept; the authority is always read back, so the
# server's files match the seeds.
steward creds init --dir "$dir/nats" --server-dir "$server_dir"
creds() {
  out="$dir/nats/$1.creds"
  shift
  # The identity a file was issued for is kept beside it, so a renamed
  # instance is issued again rather than kept with the old scope.
  if [ -s "$out" ] && [ "$(cat "$out.for" 2>/dev/null)" = "$*" ]; then
    echo "keys: $out exists, kept"
    return
  fi
  steward creds issue "$@" --account-seed "$dir/nats/signing.nk" --out "$out"
  echo "$*" > "$out.for"
}
creds operator operator
creds publisher publisher
# One identity per worker instance, in <worker>.creds, scoped to the
# instance compose.yaml configures (x-instances). An instance renamed gets
# new credentials: the old file is replaced.
creds converge converge "${CONVERGE_INSTALL:?}"
creds join join "${JOIN_BOX:?}"
creds credential credential "${CREDENTIAL_HIVE:?}"
creds provision provision "${PROVISION_MACHINE:?}"

# The ingress signs credential.rotated and grant.changed only for a scoped
# token: one for this compose's own hive and machine, its document signed by
# the operator, its secret in scoped-token (docs/design.md §7).
if [ ! -s "$dir/scoped-token" ]; then
  mkdir -p "$dir/tokens"
  rm -f "$dir/tokens/compose.json"
  STEWARD_NATS_CREDS="$dir/nats/operator.creds" steward token issue compose \
    --types credential.rotated,grant.changed --keys "${CREDENTIAL_HIVE:?},${PROVISION_MACHINE:?}" --window 1000 \
    --dir "$dir/tokens" --out "$dir/scoped-token.tmp"
  mv -f "$dir/scoped-token.tmp" "$dir/scoped-token"
  echo "keys: scoped-token written (token compose, for ${CREDENTIAL_HIVE} and ${PROVISION_MACHINE})"
fi
