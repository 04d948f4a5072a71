//go:build !linux

package host

// machineBytes is the memory this process can hope to allocate; off Linux
// only Go's own bound on one allocation is known.
func machineBytes() int64 { return maxGoAlloc }
