package host

import (
	"os"
	"syscall"
	"unsafe"
)

// reserveMem reserves size bytes of address space; the system backs a page
// with memory when it is first touched.
func reserveMem(size int64) ([]byte, error) {
	return syscall.Mmap(-1, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
}

func releaseMem(b []byte) error { return syscall.Munmap(b) }

var osPage = uintptr(os.Getpagesize())

// discardMem zeroes b, giving the system's pages wholly inside it back (a
// device page may be smaller than the system's: madvise rounds up, which
// would drop the neighbour's bytes too).
func discardMem(b []byte) {
	if len(b) == 0 {
		return
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	lo := (start + osPage - 1) &^ (osPage - 1)
	hi := (start + uintptr(len(b))) &^ (osPage - 1)
	if hi <= lo {
		clear(b)
		return
	}
	clear(b[:lo-start])
	clear(b[hi-start:])
	if syscall.Madvise(b[lo-start:hi-start], syscall.MADV_DONTNEED) != nil {
		clear(b[lo-start : hi-start])
	}
}
