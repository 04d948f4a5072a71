// Package native is what the vendor backends (device/cuda, device/ascend)
// share around their runtime's calls: the tables of native handles a device
// made (streams, events, memory), so that Destroy refuses a handle the device
// did not create and Close releases what is left, and the three copies of
// device.Device over one asynchronous copy call. The backends keep only the
// calls themselves.
package native

import (
	"errors"
	"fmt"
	"sync"

	"github.com/chameleon-go/chameleon/device"
)

// Table is the set of handles of one kind that one device made, each with a
// value of the backend's choosing (struct{} when it needs none). It is safe
// for concurrent use.
type Table[H ~uintptr, V any] struct {
	backend, kind string // for error messages: "cuda", "stream"

	mu sync.Mutex
	m  map[H]V
}

// NewTable returns an empty table. backend and kind name the table in errors
// ("cuda: destroy stream 0x1: ...").
func NewTable[H ~uintptr, V any](backend, kind string) *Table[H, V] {
	return &Table[H, V]{backend: backend, kind: kind, m: make(map[H]V)}
}

// Create makes a handle with create, which stores it through its argument,
// and records it with v.
func (t *Table[H, V]) Create(create func(h *uintptr) error, v V) (H, error) {
	var h uintptr
	if err := create(&h); err != nil {
		return 0, fmt.Errorf("%s: new %s: %w", t.backend, t.kind, err)
	}
	t.mu.Lock()
	t.m[H(h)] = v
	t.mu.Unlock()
	return H(h), nil
}

// Get returns the value of h, and false for a handle the table does not hold.
func (t *Table[H, V]) Get(h H) (V, bool) {
	t.mu.Lock()
	v, ok := t.m[h]
	t.mu.Unlock()
	return v, ok
}

// Len returns the number of handles held.
func (t *Table[H, V]) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// Destroy forgets h and releases it with destroy. A handle the table does
// not hold is an error wrapping device.ErrInvalidValue, and destroy is not
// called.
func (t *Table[H, V]) Destroy(h H, destroy func(h uintptr) error) error {
	t.mu.Lock()
	_, ok := t.m[h]
	delete(t.m, h)
	t.mu.Unlock()
	if !ok {
		return fmt.Errorf("%s: destroy %s %#x: not created by this device: %w", t.backend, t.kind, uintptr(h), device.ErrInvalidValue)
	}
	if err := destroy(uintptr(h)); err != nil {
		return fmt.Errorf("%s: destroy %s %#x: %w", t.backend, t.kind, uintptr(h), err)
	}
	return nil
}

// DestroyAll releases every handle held, for Close, and returns the errors
// joined.
func (t *Table[H, V]) DestroyAll(destroy func(h uintptr) error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	var errs []error
	for h := range t.m {
		if err := destroy(uintptr(h)); err != nil {
			errs = append(errs, fmt.Errorf("destroy %s %#x: %w", t.kind, uintptr(h), err))
		}
	}
	clear(t.m)
	return errors.Join(errs...)
}
