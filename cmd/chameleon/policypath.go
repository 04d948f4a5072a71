package main

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// checkPolicyFile refuses, before any work, a --policy-file the replay
// could not save at its end: a directory, or a path whose directory is
// missing, not a directory or not writable. It creates nothing: a missing
// file is a first run, loaded as empty and written at the end.
func checkPolicyFile(path string) error {
	if path == "" {
		return nil
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return usagef("--policy-file %s: a directory; give the path of a file in it", path)
	}
	dir := filepath.Dir(path)
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return usagef("--policy-file %s: directory %s does not exist; the file is saved there at the end of the replay: create the directory first", path, dir)
	case err != nil:
		return usagef("--policy-file %s: %v", path, err)
	case !st.IsDir():
		return usagef("--policy-file %s: %s is not a directory", path, dir)
	}
	if err := writableDir(dir); err != nil {
		return usagef("--policy-file %s: directory %s is not writable (%v); the file is saved there at the end of the replay", path, dir, err)
	}
	return nil
}
