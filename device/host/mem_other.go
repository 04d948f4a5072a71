//go:build !linux

package host

// reserveMem falls back to Go memory: the whole range counts as in use by
// the process, though only mapped pages count against the device.
func reserveMem(size int64) ([]byte, error) { return make([]byte, size), nil }

func releaseMem([]byte) error { return nil }

func discardMem(b []byte) { clear(b) }
