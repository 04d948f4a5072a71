//go:build unix

package policyfile

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWriteAtomicUmaskSymlinkStale: a first file honours the umask, a
// symbolic link is written through (the link stays, its target changes),
// and the temporaries a killed save left are removed, a fresh one kept.
func TestWriteAtomicUmaskSymlinkStale(t *testing.T) {
	dir := t.TempDir()
	old := syscall.Umask(0o077)
	path := filepath.Join(dir, "p.json")
	err := WriteAtomic(path, []byte("{}\n"), SaveHooks{})
	syscall.Umask(old)
	require.NoError(t, err)
	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "0666 less a umask of 077")

	target := filepath.Join(dir, "real.json")
	require.NoError(t, os.WriteFile(target, []byte("old"), 0o640))
	link := filepath.Join(dir, "link.json")
	require.NoError(t, os.Symlink(target, link))
	require.NoError(t, WriteAtomic(link, []byte("new"), SaveHooks{}))
	fi, err := os.Lstat(link)
	require.NoError(t, err)
	assert.Equal(t, os.ModeSymlink, fi.Mode()&os.ModeSymlink, "the link stays a link")
	got, err := os.ReadFile(target)
	require.NoError(t, err)
	assert.Equal(t, "new", string(got))
	st, err = os.Stat(target)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o640), st.Mode().Perm(), "the target keeps its mode")

	stale := filepath.Join(dir, ".p.json.tmp-killed")
	fresh := filepath.Join(dir, ".p.json.tmp-underway")
	require.NoError(t, os.WriteFile(stale, make([]byte, 1<<20), 0o600))
	require.NoError(t, os.WriteFile(fresh, nil, 0o600))
	long := time.Now().Add(-2 * StaleAfter)
	require.NoError(t, os.Chtimes(stale, long, long))
	assert.Equal(t, 1, CleanStale(path))
	assert.NoFileExists(t, stale)
	assert.FileExists(t, fresh, "a save under way keeps its temporary")
	require.NoError(t, os.Chtimes(fresh, long, long))
	require.NoError(t, WriteAtomic(path, []byte("{}\n"), SaveHooks{}))
	assert.NoFileExists(t, fresh, "a save removes what a killed one left")
}
