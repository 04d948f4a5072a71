package policyfile

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWriteAtomicInterrupted: a save interrupted at any of its writes, its
// sync, close or rename leaves the file it replaces as it was, and one
// interrupted at the directory's sync leaves the new file whole (and says
// so: ErrRenamed); never a temporary file behind.
func TestWriteAtomicInterrupted(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policies.json")
	old := bytes.Repeat([]byte("old "), 1000)
	data := bytes.Repeat([]byte("new!"), 10_000)
	require.NoError(t, os.WriteFile(path, old, 0o600))

	var steps []string
	count := SaveHooks{Chunk: 4096, Step: func(what string) error { steps = append(steps, what); return nil }}
	require.NoError(t, WriteAtomic(filepath.Join(t.TempDir(), "count.json"), data, count))
	want := []string{"write", "write", "write", "write", "write", "write", "write", "write", "write", "write", "sync", "close", "rename", "syncdir"}
	require.Equal(t, want, steps, "10 writes of 4 KiB, then the sync, close, rename and the directory's sync")

	crash := errors.New("crash")
	for k := range steps {
		n := 0
		err := WriteAtomic(path, data, SaveHooks{Chunk: 4096, Step: func(string) error {
			if n++; n > k {
				return crash
			}
			return nil
		}})
		require.ErrorIs(t, err, crash, "step %d (%s)", k, steps[k])
		got, err2 := os.ReadFile(path)
		require.NoError(t, err2)
		if steps[k] == "syncdir" {
			assert.ErrorIs(t, err, ErrRenamed)
			assert.Equal(t, data, got, "renamed already: the new file is whole")
			require.NoError(t, os.WriteFile(path, old, 0o600))
		} else {
			assert.NotErrorIs(t, err, ErrRenamed)
			require.Equal(t, old, got, "interrupted at step %d (%s): the old file changed", k, steps[k])
		}
		ents, err := os.ReadDir(dir)
		require.NoError(t, err)
		require.Len(t, ents, 1, "interrupted at step %d (%s): a temporary file is left", k, steps[k])
	}

	require.NoError(t, WriteAtomic(path, data, SaveHooks{}))
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, data, got)
	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "the replaced file's permissions are kept")
}

// TestWriteAtomicNew: a new file is 0644, in the
// directory named, or the working directory for a bare name.
func TestWriteAtomicNew(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	require.NoError(t, WriteAtomic("bare.json", []byte("x\n"), SaveHooks{}))
	got, err := os.ReadFile(filepath.Join(dir, "bare.json"))
	require.NoError(t, err)
	assert.Equal(t, "x\n", string(got))
	st, err := os.Stat(filepath.Join(dir, "bare.json"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), st.Mode().Perm())

	err = WriteAtomic(filepath.Join(dir, "missing", "p.json"), []byte("x"), SaveHooks{})
	require.ErrorIs(t, err, os.ErrNotExist, "no directory: no file")
}
