package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteReplacesWithModeAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "secret")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != "new" {
		t.Fatalf("content %q, %v", got, err)
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("want only the file, found %d entries", len(entries))
	}
}

func TestWriteIntoMissingFolderFailsAndWritesNothing(t *testing.T) {
	dir := t.TempDir()
	if err := Write(filepath.Join(dir, "nope", "f"), []byte("x"), 0o600); err == nil {
		t.Fatal("want an error for a missing folder")
	}
}

func TestWriteNewCreatesOnceAndNeverOverwrites(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "key")
	if err := WriteNew(path, []byte("first"), 0o600); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("stat %v, mode %v, want 0600", err, fi.Mode().Perm())
	}
	err = WriteNew(path, []byte("second"), 0o644)
	if !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second WriteNew: %v, want an error wrapping fs.ErrExist", err)
	}
	if got, _ := os.ReadFile(path); string(got) != "first" {
		t.Fatalf("content %q after a refused overwrite, want \"first\"", got)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v after a refused overwrite", fi.Mode().Perm())
	}
	// A dangling symlink is something there too: following it would
	// create a file wherever it points.
	link := filepath.Join(dir, "link")
	target := filepath.Join(dir, "elsewhere")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := WriteNew(link, []byte("x"), 0o600); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("WriteNew over a dangling link: %v, want fs.ErrExist", err)
	}
	if _, err := os.Lstat(target); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("WriteNew followed the link and created %s", target)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Fatalf("want the file and the link only, found %d entries", len(entries))
	}
	if err := WriteNew(filepath.Join(dir, "nope", "f"), []byte("x"), 0o600); err == nil || errors.Is(err, fs.ErrExist) {
		t.Fatalf("WriteNew into a missing folder: %v, want a plain error", err)
	}
}
