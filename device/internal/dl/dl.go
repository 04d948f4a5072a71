// Package dl loads vendor runtime libraries with purego, without cgo, for the
// cuda and ascend backends: ordered lookup with an error naming every place
// tried, and symbol binding that reports a missing symbol as an error instead
// of panicking as purego.RegisterLibFunc does.
package dl

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"

	"github.com/ebitengine/purego"
)

// Library is an open shared library.
type Library struct {
	Handle uintptr
	Path   string
}

var (
	mu    sync.Mutex
	cache = map[string]*Library{}
)

// Open tries candidates in order and returns the first that loads. Opened
// libraries are cached by path and never closed: vendor runtimes register
// exit handlers and do not survive being unloaded. The error wraps notFound
// and names every candidate with the loader's reason.
func Open(candidates []string, notFound error) (*Library, error) {
	mu.Lock()
	defer mu.Unlock()
	var tried []string
	for _, c := range candidates {
		if c == "" {
			continue
		}
		if l, ok := cache[c]; ok {
			return l, nil
		}
		h, err := dlopen(c)
		if err != nil {
			tried = append(tried, fmt.Sprintf("%s (%v)", c, err))
			continue
		}
		l := &Library{Handle: h, Path: c}
		cache[c] = l
		return l, nil
	}
	return nil, fmt.Errorf("%w: tried %s", notFound, strings.Join(tried, "; "))
}

// dlopen runs on a locked OS thread: dlerror state is per thread, and the
// goroutine must not move between the failing call and reading its reason.
func dlopen(path string) (uintptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
}

// Sym returns the address of name, or an error naming the symbol.
func (l *Library) Sym(name string) (uintptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	p, err := purego.Dlsym(l.Handle, name)
	if err != nil || p == 0 {
		return 0, fmt.Errorf("%s: symbol %s: %w", l.Path, name, ErrMissingSymbol)
	}
	return p, nil
}

// ErrMissingSymbol reports a symbol the library does not export.
var ErrMissingSymbol = errors.New("missing symbol")

// Func is one binding: a pointer to a Go function variable and the C symbol.
type Func struct {
	Ptr  any
	Name string
}

// Bind resolves every symbol before registering any, so that a library
// missing one symbol leaves all variables untouched.
func (l *Library) Bind(funcs ...Func) error {
	addrs := make([]uintptr, len(funcs))
	var missing []error
	for i, f := range funcs {
		p, err := l.Sym(f.Name)
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
