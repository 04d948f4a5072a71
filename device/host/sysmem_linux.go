package host

import "syscall"

// machineBytes is the memory this process can hope to allocate: physical
// memory plus swap. A Go allocation the kernel refuses is a fatal error, not
// a panic, so sizes above this are refused before they reach the runtime.
func machineBytes() int64 {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return maxGoAlloc
	}
	total := (uint64(si.Totalram) + uint64(si.Totalswap)) * uint64(si.Unit)
	return int64(min(total, maxGoAlloc))
}
