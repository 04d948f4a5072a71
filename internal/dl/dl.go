// Package dl loads vendor libraries with purego, without cgo, for the cuda
// and ascend backends and the GPU example: ordered lookup with an error
// naming every place tried, and symbol binding that reports a missing symbol
// as an error instead of panicking as purego.RegisterLibFunc does.
package dl

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Library is an open shared library.
type Library struct {
	Handle uintptr
	Path   string
}

type cacheKey struct {
	path   string
	global bool
}

var (
	mu    sync.Mutex
	cache = map[cacheKey]*Library{}
)

// Open tries candidates in order and returns the first that loads, with its
// symbols kept local (RTLD_LOCAL). Opened libraries are cached by path and
// never closed: vendor runtimes register exit handlers and do not survive
// being unloaded. The error wraps notFound and names every candidate with
// the loader's reason.
func Open(candidates []string, notFound error) (*Library, error) {
	return open(candidates, false, notFound)
}

// OpenGlobal is Open with the library's symbols made available to the
// libraries loaded after it (RTLD_GLOBAL): libcublas finds the libcublasLt
// it depends on that way when both sit in a directory the loader does not
// search.
func OpenGlobal(candidates []string, notFound error) (*Library, error) {
	return open(candidates, true, notFound)
}

func open(candidates []string, global bool, notFound error) (*Library, error) {
	mu.Lock()
	defer mu.Unlock()
	var tried []string
	for _, c := range candidates {
		if c == "" {
			continue
		}
		k := cacheKey{c, global}
		if l, ok := cache[k]; ok {
			return l, nil
		}
		h, err := dlopen(c, global)
		if err != nil {
			tried = append(tried, fmt.Sprintf("%s (%v)", c, err))
			continue
		}
		l := &Library{Handle: h, Path: c}
		cache[k] = l
		return l, nil
	}
	return nil, fmt.Errorf("%w: tried %s", notFound, strings.Join(tried, "; "))
}

// dlopen runs on a locked OS thread: dlerror state is per thread, and the
// goroutine must not move between the failing call and reading its reason.
func dlopen(path string, global bool) (uintptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	mode := purego.RTLD_NOW | purego.RTLD_LOCAL
	if global {
		mode = purego.RTLD_NOW | purego.RTLD_GLOBAL
	}
	return purego.Dlopen(path, mode)
}

// Sym returns the address of the first of names the library exports
// (versioned names first, where the headers rename a function), or an error
// naming them.
func (l *Library) Sym(names ...string) (uintptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for _, n := range names {
		if p, err := purego.Dlsym(l.Handle, n); err == nil && p != 0 {
			return p, nil
		}
	}
	return 0, fmt.Errorf("%s: symbol %s: %w", l.Path, strings.Join(names, " or "), ErrMissingSymbol)
}

// ErrMissingSymbol reports a symbol the library does not export.
var ErrMissingSymbol = errors.New("missing symbol")

// Func is one binding: a pointer to a Go function variable and the C
// symbol, with Alt the names tried after Name when the library does not
// export it.
type Func struct {
	Ptr  any
	Name string
	Alt  []string
}

// Bind resolves every symbol before registering any, so that a library
// missing one symbol leaves all variables untouched.
func (l *Library) Bind(funcs ...Func) error {
	addrs := make([]uintptr, len(funcs))
	var missing []error
	for i, f := range funcs {
		p, err := l.Sym(append([]string{f.Name}, f.Alt...)...)
		if err != nil {
			missing = append(missing, err)
			continue
		}
		addrs[i] = p
	}
	if len(missing) > 0 {
		return errors.Join(missing...)
	}
	for i, f := range funcs {
		purego.RegisterFunc(f.Ptr, addrs[i])
	}
	return nil
}

// CString is s as a NUL-terminated byte slice; pass &b[0] to C.
func CString(s string) []byte { return append([]byte(s), 0) }

// GoString copies a NUL-terminated C string.
func GoString(p *byte) string {
	if p == nil {
		return ""
	}
	var n int
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}
