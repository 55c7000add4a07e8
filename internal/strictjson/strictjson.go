// Package strictjson decodes signed documents the way a reviewer reads
// them. encoding/json matches object keys to fields case-insensitively and
// lets the last of two equal keys win, so a document that jq shows with
// "opsImage" can make a worker run "OpsImage" under the same valid
// signature. Decode refuses every such document instead.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
)

// ErrNotStrict marks a document Decode refuses: a duplicate key, a key that
// matches a field only when case is ignored, an unknown key, or trailing
// data after the document.
var ErrNotStrict = errors.New("not a strict JSON document")

// Decode decodes data into v, which must be a non-nil pointer, refusing
// duplicate keys at any depth, keys that are not the exact name of a field
// of the struct they decode into, unknown keys and trailing data.
func Decode(data []byte, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("strictjson: Decode needs a non-nil pointer, got %T", v)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := check(dec, rv.Type().Elem(), "$"); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: data after the document", ErrNotStrict)
	}
	strict := json.NewDecoder(bytes.NewReader(data))
	strict.DisallowUnknownFields()
	if err := strict.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", ErrNotStrict, err)
	}
	return nil
}

// check walks one JSON value with the type it decodes into.
func check(dec *json.Decoder, t reflect.Type, path string) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("%w: at %s: %v", ErrNotStrict, path, err)
	}
	delim, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	switch delim {
	case '[':
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; dec.More(); i++ {
			if err := check(dec, elem, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case '{':
		fields := fieldsOf(t)
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return fmt.Errorf("%w: at %s: %v", ErrNotStrict, path, err)
			}
			key := tok.(string)
			if seen[key] {
				return fmt.Errorf("%w: key %q appears twice in %s", ErrNotStrict, key, path)
			}
			seen[key] = true
			var next reflect.Type
			switch {
			case fields != nil:
				ft, ok := fields[key]
				if !ok {
					return fmt.Errorf("%w: key %q in %s is not a field of the document (field names are case-sensitive)", ErrNotStrict, key, path)
				}
				next = ft
			case t != nil && t.Kind() == reflect.Map:
				next = t.Elem()
			}
			if err := check(dec, next, path+"."+key); err != nil {
				return err
			}
		}
	}
	if _, err := dec.Token(); err != nil { // the closing delimiter
		return fmt.Errorf("%w: at %s: %v", ErrNotStrict, path, err)
	}
	return nil
}

// fieldsOf maps the exact JSON names of a struct's fields to their types,
// nil for anything that is not a struct.
func fieldsOf(t reflect.Type) map[string]reflect.Type {
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	fields := map[string]reflect.Type{}
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && name == "" {
			for n, ft := range fieldsOf(derefType(f.Type)) {
				fields[n] = ft
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = f.Type
	}
	return fields
}

func derefType(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}
