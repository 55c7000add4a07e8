package strictjson_test

import (
	"errors"
	"testing"

	"github.com/steward-dev/steward/internal/strictjson"
)

type item struct {
	Name string `json:"name"`
}

type doc struct {
	OpsImage string            `json:"opsImage"`
	Version  string            `json:"version,omitempty"`
	Items    []item            `json:"items,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
	Inner    *item             `json:"inner,omitempty"`
}

func TestDecodeAcceptsExactDocuments(t *testing.T) {
	var d doc
	err := strictjson.Decode([]byte(`{"opsImage":"a@sha256:1","items":[{"name":"x"}],"labels":{"K":"v","k":"w"},"inner":{"name":"y"}}`), &d)
	if err != nil {
		t.Fatal(err)
	}
	if d.OpsImage != "a@sha256:1" || d.Items[0].Name != "x" || d.Labels["K"] != "v" || d.Inner.Name != "y" {
		t.Fatalf("decoded %+v", d)
	}
}

func TestDecodeRefuses(t *testing.T) {
	for name, in := range map[string]string{
		"case twin":            `{"opsImage":"good","OpsImage":"evil"}`,
		"case only":            `{"OpsImage":"evil"}`,
		"duplicate":            `{"opsImage":"good","opsImage":"evil"}`,
		"nested duplicate":     `{"opsImage":"a","items":[{"name":"x","name":"y"}]}`,
		"nested case":          `{"opsImage":"a","inner":{"Name":"y"}}`,
		"map duplicate":        `{"opsImage":"a","labels":{"k":"v","k":"w"}}`,
		"unknown":              `{"opsImage":"a","extra":1}`,
		"trailing":             `{"opsImage":"a"} {"opsImage":"b"}`,
		"truncated":            `{"opsImage":"a"`,
		"not an object at all": `"opsImage"`,
	} {
		t.Run(name, func(t *testing.T) {
			var d doc
			err := strictjson.Decode([]byte(in), &d)
			if !errors.Is(err, strictjson.ErrNotStrict) {
				t.Fatalf("Decode(%s) = %v, want ErrNotStrict", in, err)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"opsImage":"a","items":[{"name":"x"}]}`))
	f.Add([]byte(`{"opsImage":"a","OpsImage":"b"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var d doc
		if strictjson.Decode(data, &d) != nil {
			return
		}
		// Whatever Decode accepts, encoding/json reads the same way.
		var again doc
		if err := strictjson.Decode(data, &again); err != nil || again.OpsImage != d.OpsImage {
			t.Fatalf("not deterministic: %v", err)
		}
	})
}
