package chameleon

import (
	"bytes"
	"runtime"
	"strconv"
	"sync/atomic"
)

// callbackGuard knows the goroutine running an Op.Recompute callback: the
// Engine's lock is held across the callback, so a call of that goroutine
// back into the Engine would wait for itself. Such a call is refused with
// ErrInCallback (a read, Stats say, is served, the lock being its
// goroutine's already); another goroutine's call waits for the lock as
// always.
type callbackGuard struct {
	running atomic.Bool
	g       atomic.Uint64 // the goroutine running it, valid while running
}

// enter marks the calling goroutine as running a callback.
func (c *callbackGuard) enter() {
	c.g.Store(goroutineID())
	c.running.Store(true)
}

// leave ends the callback.
func (c *callbackGuard) leave() { c.running.Store(false) }

// inside reports whether the calling goroutine runs a callback now.
func (c *callbackGuard) inside() bool {
	return c.running.Load() && c.g.Load() == goroutineID()
}

// goroutineID is the calling goroutine's number, read from its stack
// header ("goroutine 17 [running]:"). Only asked while a callback runs.
func goroutineID() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, _ := strconv.ParseUint(string(b), 10, 64)
	return id
}

// lock takes the Engine's lock for a call that changes it, or refuses a
// call from inside an Op.Recompute callback.
func (e *Engine) lock() error {
	if e.cb.inside() {
		return ErrInCallback
	}
	e.mu.Lock()
	return nil
}

// rlock takes the Engine's lock for a call that only reads it, and returns
// its release; inside an Op.Recompute callback the lock is the caller's
// already.
func (e *Engine) rlock() (unlock func()) {
	if e.cb.inside() {
		return func() {}
	}
	e.mu.Lock()
	return e.mu.Unlock
}
