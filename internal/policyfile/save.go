package policyfile

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// SaveHooks are how WriteAtomic writes, and let a test interrupt it.
type SaveHooks struct {
	// Chunk is the most bytes of one write; 0: all in one.
	Chunk int
	// Step, when not nil, is called before each write ("write"), the
	// file's sync ("sync"), its close ("close"), the rename ("rename") and
	// the directory's sync ("syncdir"); an error from it fails that step
	// as a crash or a full disk would.
	Step func(what string) error
}

// WriteAtomic replaces path with data, or leaves it as it was: data goes
// to a temporary file in path's directory (.NAME.tmp-*), which is synced,
// closed and renamed over path, and the directory is synced so that the
// rename survives a power loss. The new file keeps the permissions of the
// one it replaces; a first one gets 0666 less the process's umask, as any
// file the process creates. A path that is a symbolic link is written
// through: its target is replaced, the link stays. Temporaries a killed
// save left beside path are removed first (CleanStale). On a failure up to
// the rename the temporary file is removed and path is as it was; an error
// of Step at "syncdir" comes joined with ErrRenamed, the new file being in
// place.
func WriteAtomic(path string, data []byte, h SaveHooks) (err error) {
	step := func(what string) error {
		if h.Step != nil {
			return h.Step(what)
		}
		return nil
	}
	if target, err := filepath.EvalSymlinks(path); err == nil {
		path = target
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	CleanStale(path)
	var mode fs.FileMode
	keep := false
	if st, err := os.Stat(path); err == nil {
		mode, keep = st.Mode().Perm(), true
	}
	f, tmp, err := createTemp(dir, base)
	if err != nil {
		return err
	}
	closed := false
	defer func() {
		if err != nil {
			if !closed {
				f.Close()
			}
			os.Remove(tmp)
		}
	}()
	chunk := h.Chunk
	if chunk <= 0 {
		chunk = len(data) + 1
	}
	for off := 0; off < len(data); off += chunk {
		if err := step("write"); err != nil {
			return err
		}
		end := min(off+chunk, len(data))
		n, err := f.Write(data[off:end])
		if err != nil {
			return err
		}
		if n != end-off {
			return fmt.Errorf("short write to %s: %d of %d bytes", tmp, n, end-off)
		}
	}
	if keep {
		if err := f.Chmod(mode); err != nil {
			return err
		}
	}
	if err := step("sync"); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := step("close"); err != nil {
		return err
	}
	closed = true
	if err := f.Close(); err != nil {
		return err
	}
	if err := step("rename"); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	// The new file is in place: from here a failure is reported but the
	// temporary name is gone, so nothing is removed.
	if err := step("syncdir"); err != nil {
		return errors.Join(err, ErrRenamed)
	}
	return syncDir(dir)
}

// createTemp creates a new temporary file beside base in dir, with 0666
// less the umask, as any new file of the process.
func createTemp(dir, base string) (*os.File, string, error) {
	for range 100 {
		name := filepath.Join(dir, tempPrefix(base)+strconv.FormatUint(rand.Uint64(), 36))
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return f, name, err
	}
	return nil, "", fmt.Errorf("no free temporary name for %s in %s", base, dir)
}

// tempPrefix is the name of base's temporaries, before their random part.
func tempPrefix(base string) string { return "." + base + ".tmp-" }

// StaleAfter is how long a temporary beside a policy file goes untouched
// before it counts as left by a save that was killed: a save writes its
// file within seconds.
const StaleAfter = time.Minute

// CleanStale removes the temporaries beside path that a killed save left
// (.NAME.tmp-*, untouched for StaleAfter), and reports how many. A save
// under way keeps writing its own, so it is never taken for one.
func CleanStale(path string) int {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	es, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range es {
		if e.IsDir() || !strings.HasPrefix(e.Name(), tempPrefix(base)) {
			continue
		}
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < StaleAfter {
			continue
		}
		if os.Remove(filepath.Join(dir, e.Name())) == nil {
			n++
		}
	}
	return n
}

// ErrRenamed says that a save failed after its file was in place.
var ErrRenamed = errors.New("the new file is in place but its directory was not synced")

// syncDir syncs the directory dir, where the system can.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
