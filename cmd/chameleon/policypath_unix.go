//go:build unix

package main

import "syscall"

// writableDir reports why the process may not create files in dir, nil
// when it may: access(2) with W_OK, which creates nothing.
func writableDir(dir string) error {
	const wOK = 2 // W_OK, the same on every Unix
	return syscall.Access(dir, wOK)
}
