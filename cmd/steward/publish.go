package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/agekey"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/publisher"
)

// cliSource is the CloudEvents source of events published from the command
// line without --source.
const cliSource = "/steward/cli"

type publishFlags struct {
	typ, key, data, source, id string
	file                       string
	secretFile, recipient      string
	// signingKey is the controller's private key that signs
	// credential.rotated and grant.changed.
	signingKey string
	// yes confirms signing the records of --file, after their summary.
	yes bool
}

func newPublishCmd(g *globals) *cobra.Command {
	f := &publishFlags{}
	cmd := &cobra.Command{
		Use:   "publish",
		Short: "Publish one event, or a JSONL file of events",
		Long: `Publish one event built from --type and --data (the key is read from the data
when --key is not given), or every event of --file (CloudEvents in the JSON
format, one per line). Events are validated first; with --file nothing is
published unless every event is valid.

With --secret-file and --recipient the file's content, byte for byte, is
encrypted with age to the recipient and set as the data's "secret" field, so
the plaintext never travels (credential.rotated).

With --signing-key (the controller's ed25519 private key, steward keys --kind
controller) every credential.rotated and grant.changed event is signed after
it is validated: a DSSE envelope naming the hive or machine and binding every
field, the secrets by their ciphertext's SHA-256. A site.membership record's
data is the site's whole membership, {site, generation, boxes, hives,
machines}; it is checked (keys, no key twice, a positive generation) and
signed, and the event carries {site, envelope} (steward site setup reads it). The key signs only desired
state handed to it as such: with --file, each line must be a record of
{type, key, data} and nothing else (the controller's own source of truth),
never an exported stream (id, source, time) nor data that already holds an
envelope, since a stream holds whatever anyone who may publish stored in it.
The records' keys, versions and generations are printed, and nothing is
signed or published without --yes.

Each stored event is printed with its stream sequence and whether JetStream
already held it (duplicate=true: same id inside the dedupe window, nothing new
stored). With --file, progress goes to stderr when publishing takes over a
second.`,
		Example: `  steward publish --type dev.steward.release.published.v1 --data '{"version":"1.2.3"}'
  steward publish --type dev.steward.credential.rotated.v1 \
    --data '{"hive":"dev","version":2,"clientId":"client-2"}' \
    --secret-file ./secret.txt --recipient ./age.pub --signing-key ./controller.key
  steward publish --file desired.jsonl --signing-key ./controller.key --yes
    # a line of desired.jsonl naming site a's keys:
    # {"type":"dev.steward.site.membership.v1","key":"site-a","data":{"site":"site-a","generation":2,"boxes":[],"hives":["hive-1"],"machines":["db-1"]}}`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var list []event.Event
			var err error
			if f.file != "" && f.signingKey != "" {
				list, err = f.desired()
			} else {
				list, err = f.events(cmd.InOrStdin())
			}
			if err != nil {
				return err
			}
			signer, err := loadSigner(f.signingKey)
			if err != nil {
				return err
			}
			if f.file != "" && signer != nil {
				// The operator reads what the key is about to vouch for
				// before it does.
				if err := summarize(cmd.OutOrStdout(), list); err != nil {
					return err
				}
				if !f.yes {
					return fmt.Errorf("%d records of %s would be signed with the controller key, as listed above; check the versions and generations, then run again with --yes. Nothing was signed or published", len(list), f.file)
				}
			}
			p := publisher.New(nil, publisher.WithSource(cliSource))
			for i := range list {
				if signer != nil && signing.SignedFromRecord(list[i].Type()) {
					// The record is not the event's data but what the
					// signature holds; signing checks it and makes the
					// data, which Prepare then validates.
					if list[i], err = signer.Sign(cmd.Context(), list[i]); err != nil {
						return fmt.Errorf("--signing-key (nothing was published): %w", err)
					}
				}
				if _, err := p.Prepare(&list[i]); err != nil {
					if len(list) > 1 {
						return fmt.Errorf("event %d of %s (nothing was published): %w", i+1, f.file, err)
					}
					return err
				}
				if !signing.MustSign(list[i].Type()) {
					continue
				}
				if signer == nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: event %s (%s for %s) is published unsigned (no --signing-key); its worker refuses it\n", list[i].ID(), list[i].Type(), list[i].Subject())
					continue
				}
				// Signed after validation, so only data the schema takes
				// is vouched for.
				if list[i], err = signer.Sign(cmd.Context(), list[i]); err != nil {
					return fmt.Errorf("--signing-key (nothing was published): %w", err)
				}
			}
			nc, js, err := g.connect(cmd.Context(), "steward publish", false)
			if err != nil {
				return err
			}
			defer nc.Close()
			p = publisher.New(js, publisher.WithSource(cliSource))
			out := cmd.OutOrStdout()
			var prog *progress
			if f.file != "" {
				// A recorded stream can be long; one event is not.
				prog = startProgress(cmd.ErrOrStderr(), out, "published")
				prog.setTotal(uint64(len(list)))
				defer prog.finish()
			}
			for i, e := range list {
				ack, err := p.Publish(cmd.Context(), e)
				if prog != nil {
					prog.add(1)
				}
				if err != nil {
					if i > 0 {
						return fmt.Errorf("%w (the %d events before it were stored; publishing the file again is safe, the ids deduplicate)", err, i)
					}
					return err
				}
				fmt.Fprintf(out, "published id=%s type=%s key=%s stream=%s seq=%d duplicate=%t\n",
					ack.ID, e.Type(), e.Subject(), ack.Stream, ack.Sequence, ack.Duplicate)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.typ, "type", "", "the CloudEvents type, e.g. "+events.TypeReleasePublished)
	fs.StringVar(&f.key, "key", "", "the event's key (default: read from the data's key field)")
	fs.StringVar(&f.data, "data", "", "the event's data: JSON, @file to read it from a file, or @- from stdin")
	fs.StringVar(&f.source, "source", "", "the CloudEvents source (default "+cliSource+")")
	fs.StringVar(&f.id, "id", "", "the event id, which is also the dedupe id (default: a new ULID)")
	fs.StringVar(&f.file, "file", "", "publish every event of this JSONL file instead (JSON event format, one per line)")
	fs.StringVar(&f.secretFile, "secret-file", "", "encrypt this file's content to --recipient and set it as data.secret")
	fs.StringVar(&f.recipient, "recipient", "", "the age recipient (age1...) for --secret-file, or a file holding it")
	fs.StringVar(&f.signingKey, "signing-key", "", "the controller's ed25519 private key (PEM) that signs credential.rotated, grant.changed and site.membership; with --file, the file holds {type, key, data} records only")
	fs.BoolVar(&f.yes, "yes", false, "with --file and --signing-key: sign and publish the records listed")
	return cmd
}

// events builds the events the flags describe.
func (f *publishFlags) events(stdin io.Reader) ([]event.Event, error) {
	if f.file != "" {
		if f.typ != "" || f.data != "" || f.key != "" || f.id != "" || f.secretFile != "" {
			return nil, errors.New("--file publishes the events of a file as they are; it does not go with --type, --key, --data, --id or --secret-file")
		}
		r, err := os.Open(f.file)
		if err != nil {
			return nil, fmt.Errorf("--file: %w", err)
		}
		defer r.Close()
		list, err := events.ReadJSONL(r)
		if err != nil {
			return nil, fmt.Errorf("--file %s: %w", f.file, err)
		}
		if len(list) == 0 {
			return nil, fmt.Errorf("--file %s holds no events", f.file)
		}
		for i := range list {
			if list[i].Source() == "" && f.source != "" {
				list[i].SetSource(f.source)
			}
		}
		return list, nil
	}
	if f.typ == "" {
		return nil, errors.New("--type is required (or --file): one of " + strings.Join(typeNames(), ", "))
	}
	if _, ok := events.Lookup(f.typ); !ok {
		return nil, fmt.Errorf("--type %q is not a Steward event type: one of %s", f.typ, strings.Join(typeNames(), ", "))
	}
	if f.data == "" {
		return nil, errors.New("--data is required: the event's data as JSON, or @file")
	}
	data, err := readArg(f.data, stdin)
	if err != nil {
		return nil, fmt.Errorf("--data: %w", err)
	}
	if f.secretFile != "" || f.recipient != "" {
		if data, err = f.withSecret(data); err != nil {
			return nil, err
		}
	}
	key := f.key
	if key == "" {
		if key, err = events.KeyOf(f.typ, data); err != nil {
			return nil, fmt.Errorf("--key not given and %w", err)
		}
	}
	// Built by hand rather than with events.New, which checks the key
	// first: Prepare then runs events.Validate, whose errors name the
	// field and the schema rule.
	e := event.New()
	e.SetType(f.typ)
	e.SetSubject(key)
	if err := e.SetData(events.ContentTypeJSON, data); err != nil {
		return nil, fmt.Errorf("--data: %w", err)
	}
	if f.source != "" {
		e.SetSource(f.source)
	}
	if f.id != "" {
		e.SetID(f.id)
	}
	return []event.Event{e}, nil
}

// desiredFields are the only fields of a record of desired state.
var desiredFields = []string{"type", "key", "data"}

// desired reads --file as desired state for the controller key to sign:
// one {type, key, data} record a line. Anything else (an exported event's
// id, source, time or specversion, data already holding an envelope) is
// refused with the line, the field and the rule: what the key signs must
// come from its author's own source of truth, never from a stream that
// anyone who may publish can write into.
func (f *publishFlags) desired() ([]event.Event, error) {
	if f.typ != "" || f.data != "" || f.key != "" || f.id != "" || f.secretFile != "" {
		return nil, errors.New("--file publishes the records of a file; it does not go with --type, --key, --data, --id or --secret-file")
	}
	raw, err := os.ReadFile(f.file)
	if err != nil {
		return nil, fmt.Errorf("--file: %w", err)
	}
	var list []event.Event
	for i, line := range strings.Split(string(raw), "\n") {
		n := i + 1
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		var rec map[string]json.RawMessage
		if err := json.Unmarshal([]byte(line), &rec); err != nil || rec == nil {
			return nil, fmt.Errorf("--file %s line %d is not a JSON object; with --signing-key each line is a {type, key, data} record, so nothing was signed or published", f.file, n)
		}
		fields := slices.Sorted(maps.Keys(rec))
		for _, field := range fields {
			if !slices.Contains(desiredFields, field) {
				return nil, fmt.Errorf("--file %s line %d has field %q: with --signing-key a line is desired state, {type, key, data} and nothing else (rule: no id, source, time or other envelope, so an exported stream is never signed); republish from the controller's own records of what it wants. Nothing was signed or published", f.file, n, field)
			}
		}
		for _, field := range desiredFields {
			if _, ok := rec[field]; !ok {
				return nil, fmt.Errorf("--file %s line %d has no %q: a record of desired state is {type, key, data}. Nothing was signed or published", f.file, n, field)
			}
		}
		var typ, key string
		if json.Unmarshal(rec["type"], &typ) != nil || json.Unmarshal(rec["key"], &key) != nil {
			return nil, fmt.Errorf("--file %s line %d: type and key must be strings. Nothing was signed or published", f.file, n)
		}
		if _, ok := events.Lookup(typ); !ok {
			return nil, fmt.Errorf("--file %s line %d: type %q is not a Steward event type (one of %s). Nothing was signed or published", f.file, n, typ, strings.Join(typeNames(), ", "))
		}
		var data map[string]json.RawMessage
		if err := json.Unmarshal(rec["data"], &data); err != nil || data == nil {
			return nil, fmt.Errorf("--file %s line %d: data is not a JSON object. Nothing was signed or published", f.file, n)
		}
		if _, ok := data["envelope"]; ok && (signing.MustSign(typ) || signing.SignedFromRecord(typ)) {
			return nil, fmt.Errorf("--file %s line %d: data has an envelope: desired state is handed to the key unsigned (rule: a record that already carries a signature was copied from somewhere, not written by its author). Nothing was signed or published", f.file, n)
		}
		e := event.New()
		e.SetType(typ)
		e.SetSubject(key)
		if err := e.SetData(events.ContentTypeJSON, json.RawMessage(rec["data"])); err != nil {
			return nil, fmt.Errorf("--file %s line %d: %w", f.file, n, err)
		}
		e.SetSource(cliSource)
		if f.source != "" {
			e.SetSource(f.source)
		}
		list = append(list, e)
	}
	if len(list) == 0 {
		return nil, fmt.Errorf("--file %s holds no records", f.file)
	}
	return list, nil
}

// summarize prints, per key, what the controller key is about to sign.
func summarize(w io.Writer, list []event.Event) error {
	t := newTable(w, "TYPE", "KEY", "VERSION", "GENERATION", "SIGNED")
	for _, e := range list {
		var d struct {
			Version    json.RawMessage `json:"version"`
			Generation json.RawMessage `json:"generation"`
		}
		_ = json.Unmarshal(e.Data(), &d)
		t.row(shortType(e.Type()), e.Subject(), strings.Trim(string(d.Version), `"`), string(d.Generation), fmt.Sprint(signing.MustSign(e.Type()) || signing.SignedFromRecord(e.Type())))
	}
	return t.flush()
}

// loadSigner reads the controller's signing key; "" is none. It is the one
// signer publish, serve and dev use (signing.EventSigner).
func loadSigner(path string) (*signing.EventSigner, error) {
	if path == "" {
		return nil, nil
	}
	s, err := signing.LoadEventSigner(path)
	if err != nil {
		return nil, fmt.Errorf("--signing-key: %w", err)
	}
	return s, nil
}

// withSecret sets data.secret to the secret file's content encrypted to the
// recipient.
func (f *publishFlags) withSecret(data []byte) ([]byte, error) {
	if f.secretFile == "" || f.recipient == "" {
		return nil, errors.New("--secret-file and --recipient go together: the secret is encrypted to the recipient")
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil || fields == nil {
		return nil, errors.New("--data must be a JSON object to receive the encrypted secret")
	}
	secret, err := os.ReadFile(f.secretFile)
	if err != nil {
		return nil, fmt.Errorf("--secret-file: %w", err)
	}
	recipient, err := readRecipient(f.recipient)
	if err != nil {
		return nil, err
	}
	armored, err := agekey.Encrypt(recipient, secret)
	if err != nil {
		return nil, fmt.Errorf("--recipient: %w", err)
	}
	fields["secret"], _ = json.Marshal(armored)
	return json.Marshal(fields)
}

// readRecipient takes an age recipient as it is, or reads it from a file
// (the first line that is not a comment), as `steward keys` writes it.
func readRecipient(arg string) (string, error) {
	if strings.HasPrefix(arg, "age1") {
		return arg, nil
	}
	r, err := os.Open(arg)
	if err != nil {
		return "", fmt.Errorf("--recipient %q is neither an age recipient (age1...) nor a readable file: %w", arg, err)
	}
	defer r.Close()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line != "" && !strings.HasPrefix(line, "#") {
			return line, nil
		}
	}
	return "", fmt.Errorf("--recipient file %s holds no recipient line", arg)
}

// readArg returns a flag's value, or the content of the file it names with
// a leading '@' ("@-" is stdin).
func readArg(v string, stdin io.Reader) ([]byte, error) {
	name, ok := strings.CutPrefix(v, "@")
	if !ok {
		return []byte(v), nil
	}
	if name == "-" {
		return io.ReadAll(stdin)
	}
	return os.ReadFile(name)
}

func typeNames() []string {
	var out []string
	for _, k := range events.Kinds() {
		out = append(out, k.Type)
	}
	return out
}
