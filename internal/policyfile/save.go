package policyfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
// closed and renamed over path (keeping the permissions of the file it
// replaces, 0644 for a new one), and the directory is synced so that the
// rename survives a power loss. On a failure up to the rename the
// temporary file is removed and path is as it was; an error of Step at
// "syncdir" comes joined with ErrRenamed, the new file being in place.
func WriteAtomic(path string, data []byte, h SaveHooks) (err error) {
	step := func(what string) error {
		if h.Step != nil {
			return h.Step(what)
		}
		return nil
	}
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	mode := os.FileMode(0o644)
	if st, err := os.Stat(path); err == nil {
		mode = st.Mode().Perm()
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
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
	if err := f.Chmod(mode); err != nil {
		return err
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
