package natsauth

import (
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/steward-dev/steward/internal/atomicfile"
	"github.com/steward-dev/steward/internal/proof"
)

// The files of an authority's folder. The seeds are secrets (0600); the
// JWTs and public keys are not, and are what a NATS server is given.
const (
	OperatorSeedFile = "operator.nk"
	AccountSeedFile  = "account.nk"
	// SigningSeedFile is the account signing key: what `steward creds
	// issue` signs users with. The account's own key and the operator's
	// can then stay offline.
	SigningSeedFile = "signing.nk"
	SystemSeedFile  = "system.nk"
	// AccountPubFile holds the account's public key, for `steward creds
	// issue` to name as the issuer of users signed with the signing key.
	AccountPubFile = "account.pub"
	// OperatorJWTFile is the server's `operator:`.
	OperatorJWTFile = "operator.jwt"
	// ResolverDir holds the account JWTs, <public key>.jwt, the layout of
	// nats-server's `resolver: {type: full, dir: …}`.
	ResolverDir = "accounts"
)

// AccountName is the name of the account every Steward identity is a user
// of; SystemAccountName that of NATS's system account.
const (
	AccountName       = "STEWARD"
	SystemAccountName = "SYS"
)

// Authority is an operator, the Steward account with its signing key, and
// the system account: what a NATS server in JWT mode trusts, and what
// issues users.
type Authority struct {
	operator, account, signing, system nkeys.KeyPair

	// OperatorJWT, AccountJWT and SystemJWT are the signed claims a server
	// is configured with.
	OperatorJWT, AccountJWT, SystemJWT string
	// AccountPublic and SystemPublic are the accounts' public keys.
	AccountPublic, SystemPublic string
}

// LoadOrCreate reads the authority kept in dir, making the keys that are
// missing (seeds 0600, written atomically), and writes the server's files
// beside them: operator.jwt, account.pub and accounts/<key>.jwt. The
// keys are kept across runs, so the account, and with it the JetStream
// store, stays the same.
func LoadOrCreate(dir string) (*Authority, error) {
	if err := os.MkdirAll(filepath.Join(dir, ResolverDir), 0o700); err != nil {
		return nil, fmt.Errorf("NATS authority folder: %w", err)
	}
	a := &Authority{}
	var err error
	for _, k := range []struct {
		file string
		kp   *nkeys.KeyPair
		make func() (nkeys.KeyPair, error)
	}{
		{OperatorSeedFile, &a.operator, nkeys.CreateOperator},
		{AccountSeedFile, &a.account, nkeys.CreateAccount},
		{SigningSeedFile, &a.signing, nkeys.CreateAccount},
		{SystemSeedFile, &a.system, nkeys.CreateAccount},
	} {
		if *k.kp, err = loadOrMakeSeed(filepath.Join(dir, k.file), k.make); err != nil {
			return nil, err
		}
	}
	if err := a.sign(); err != nil {
		return nil, err
	}
	if err := atomicfile.Write(filepath.Join(dir, AccountPubFile), []byte(a.AccountPublic+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("NATS authority: %w", err)
	}
	if err := a.WriteServerFiles(dir); err != nil {
		return nil, err
	}
	return a, nil
}

// WriteServerFiles writes what a nats-server configured with
// `operator: <dir>/operator.jwt` and `resolver: {type: full, dir:
// <dir>/accounts}` needs: the operator's JWT and the accounts' JWTs. None
// is a secret, so dir can be given to the server without the seeds.
func (a *Authority) WriteServerFiles(dir string) error {
	if err := os.MkdirAll(filepath.Join(dir, ResolverDir), 0o755); err != nil {
		return fmt.Errorf("NATS server files: %w", err)
	}
	for name, content := range map[string]string{
		OperatorJWTFile: a.OperatorJWT,
		filepath.Join(ResolverDir, a.AccountPublic+".jwt"): a.AccountJWT,
		filepath.Join(ResolverDir, a.SystemPublic+".jwt"):  a.SystemJWT,
	} {
		if err := atomicfile.Write(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return fmt.Errorf("NATS server files: %w", err)
		}
	}
	return nil
}

// loadOrMakeSeed reads the nkey seed kept at path, or makes one there.
func loadOrMakeSeed(path string, make func() (nkeys.KeyPair, error)) (nkeys.KeyPair, error) {
	raw, err := os.ReadFile(path)
	if err == nil {
		kp, perr := nkeys.ParseDecoratedNKey(raw)
		if perr != nil {
			// The error of the parser is not printed: it may quote the file.
			return nil, fmt.Errorf("%s holds no nkey seed; restore it, or remove it and every credential it signed to start a new authority", path)
		}
		return kp, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("NATS authority: %w", err)
	}
	kp, err := make()
	if err != nil {
		return nil, err
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	if err := atomicfile.Write(path, append(seed, '\n'), 0o600); err != nil {
		return nil, fmt.Errorf("NATS authority: %w", err)
	}
	return kp, nil
}

// sign makes the operator's and the accounts' claims.
func (a *Authority) sign() error {
	opPub, err := a.operator.PublicKey()
	if err != nil {
		return err
	}
	if a.AccountPublic, err = a.account.PublicKey(); err != nil {
		return err
	}
	if a.SystemPublic, err = a.system.PublicKey(); err != nil {
		return err
	}
	signingPub, err := a.signing.PublicKey()
	if err != nil {
		return err
	}

	sys := jwt.NewAccountClaims(a.SystemPublic)
	sys.Name = SystemAccountName
	if a.SystemJWT, err = sys.Encode(a.operator); err != nil {
		return fmt.Errorf("sign the system account: %w", err)
	}

	acc := jwt.NewAccountClaims(a.AccountPublic)
	acc.Name = AccountName
	acc.SigningKeys.Add(signingPub)
	// JetStream for the account, bounded by the server's own limits
	// (max_file_store, max_memory_store); the streams set theirs.
	acc.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: jwt.NoLimit, DiskStorage: jwt.NoLimit, Streams: jwt.NoLimit, Consumer: jwt.NoLimit}
	// A user issued without permissions (by hand, with another tool) gets
	// none: the bus stays closed to what Steward did not scope.
	acc.DefaultPermissions.Pub.Deny.Add(">")
	acc.DefaultPermissions.Sub.Deny.Add(">")
	if a.AccountJWT, err = acc.Encode(a.operator); err != nil {
		return fmt.Errorf("sign the %s account: %w", AccountName, err)
	}

	op := jwt.NewOperatorClaims(opPub)
	op.Name = "steward"
	op.SystemAccount = a.SystemPublic
	if a.OperatorJWT, err = op.Encode(a.operator); err != nil {
		return fmt.Errorf("sign the operator: %w", err)
	}
	return nil
}

// Configure sets o up to trust the authority: operator mode with the two
// accounts preloaded in memory, the system account named. It is what an
// embedded server (steward dev, tests) uses in place of a config file.
func (a *Authority) Configure(o *server.Options) error {
	op, err := jwt.DecodeOperatorClaims(a.OperatorJWT)
	if err != nil {
		return err
	}
	r := &server.MemAccResolver{}
	if err := r.Store(a.AccountPublic, a.AccountJWT); err != nil {
		return err
	}
	if err := r.Store(a.SystemPublic, a.SystemJWT); err != nil {
		return err
	}
	o.TrustedOperators = []*jwt.OperatorClaims{op}
	o.AccountResolver = r
	o.SystemAccount = a.SystemPublic
	return nil
}

// Issue makes the credentials of id, signed with the account signing key,
// certifying docKey as id's document key (internal/proof).
func (a *Authority) Issue(id Identity, docKey ed25519.PublicKey) ([]byte, error) {
	seed, err := a.signing.Seed()
	if err != nil {
		return nil, err
	}
	return IssueCreds(seed, a.AccountPublic, id, docKey)
}

// IssueCreds makes a NATS credentials file (the user JWT and its nkey
// seed) for id, signed by the account key whose seed is signingSeed:
// the account's own key, or one of its signing keys, in which case
// account is the account's public key ("" when the seed is the account's
// own). Each call makes a new user key. The JWT certifies docKey as the
// identity's document key: tags name the key, the role, the worker and the
// instance, so any reader that trusts the account knows whose documents
// the key signs (internal/proof).
func IssueCreds(signingSeed []byte, account string, id Identity, docKey ed25519.PublicKey) ([]byte, error) {
	// A leaf node stores nothing of its own: it has no document key.
	if id.Role != RoleLeaf && len(docKey) != ed25519.PublicKeySize {
		return nil, errors.New("no document key to certify: every identity signs what it stores (steward creds issue makes one)")
	}
	signer, err := nkeys.ParseDecoratedNKey(signingSeed)
	if err != nil {
		return nil, errors.New("the account seed is not an nkey seed")
	}
	signerPub, err := signer.PublicKey()
	if err != nil {
		return nil, err
	}
	if !nkeys.IsValidPublicAccountKey(signerPub) {
		return nil, errors.New("the account seed is not an account's key (its public key does not start with A); give the account's signing key")
	}
	account = strings.TrimSpace(account)
	if account != "" && !nkeys.IsValidPublicAccountKey(account) {
		return nil, fmt.Errorf("the account %q is not an account's public key (A…)", account)
	}
	if id.Role != RoleOperator && id.Role != RolePublisher && id.Role != RoleWorker && id.Role != RoleLeaf {
		return nil, fmt.Errorf("identity role %q: want operator, publisher, worker or leaf", id.Role)
	}
	if id.Role == RoleLeaf {
		// Its permissions are built from the two names: an empty or
		// wildcard one would widen them.
		if _, err := Leaf(id.Site, id.HubDomain); err != nil {
			return nil, err
		}
	}
	user, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	userPub, err := user.PublicKey()
	if err != nil {
		return nil, err
	}
	uc := jwt.NewUserClaims(userPub)
	uc.Name = id.Name()
	if account != "" && account != signerPub {
		uc.IssuerAccount = account
	}
	uc.Tags.Add(proof.TagRole + string(id.Role))
	if len(docKey) > 0 {
		uc.Tags.Add(proof.TagKey + hex.EncodeToString(docKey))
	}
	if id.Role == RoleWorker {
		uc.Tags.Add(proof.TagWorker+id.Worker, proof.TagInstance+id.Instance)
	}
	p := id.Permissions()
	uc.Pub.Allow.Add(p.Publish...)
	uc.Sub.Allow.Add(p.Subscribe...)
	token, err := uc.Encode(signer)
	if err != nil {
		return nil, fmt.Errorf("sign the credentials of %s: %w", id.Name(), err)
	}
	userSeed, err := user.Seed()
	if err != nil {
		return nil, err
	}
	return jwt.FormatUserConfig(token, userSeed)
}

// WriteCreds issues id's credentials into path, 0600, atomically, with
// the document key beside them (proof.KeyFileFor): kept when it exists, so
// documents signed before stay verifiable, made when it does not. A leaf
// node signs nothing and gets none.
func (a *Authority) WriteCreds(path string, id Identity) error {
	var public ed25519.PublicKey
	if id.Role != RoleLeaf {
		key, err := DocumentKey(proof.KeyFileFor(path))
		if err != nil {
			return err
		}
		public = key.Public().(ed25519.PublicKey)
	}
	creds, err := a.Issue(id, public)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, creds, 0o600); err != nil {
		return fmt.Errorf("credentials of %s: %w", id.Name(), err)
	}
	return nil
}

// DocumentKey reads the document key at path, or makes one there.
func DocumentKey(path string) (ed25519.PrivateKey, error) {
	if _, err := os.Stat(path); err == nil {
		return proof.LoadKey(path)
	}
	return proof.GenerateKey(path)
}

// CredsInboxPrefix is the inbox prefix a connection with these
// credentials must use: the prefix of the one "_INBOX….>" subject its JWT
// allows subscribing to, or "" (nats.go's default, _INBOX) when the JWT
// allows _INBOX.> or cannot be read. Only the JWT is read, never the seed.
func CredsInboxPrefix(creds []byte) string {
	token, err := jwt.ParseDecoratedJWT(creds)
	if err != nil {
		return ""
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return ""
	}
	prefix := ""
	for _, s := range uc.Sub.Allow {
		if s == ">" || s == "_INBOX.>" {
			return ""
		}
		if p, ok := strings.CutSuffix(s, ".>"); ok && strings.HasPrefix(p, "_INBOX") && !strings.ContainsAny(p, "*>") {
			prefix = p
		}
	}
	return prefix
}
