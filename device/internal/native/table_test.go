package native_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/internal/native"
)

func TestTable(t *testing.T) {
	tab := native.NewTable[device.Stream, int]("fake", "stream")
	next := uintptr(0x10)
	create := func(h *uintptr) error { *h = next; next += 0x10; return nil }
	var destroyed []uintptr
	destroy := func(h uintptr) error { destroyed = append(destroyed, h); return nil }

	a, err := tab.Create(create, 1)
	require.NoError(t, err)
	b, err := tab.Create(create, 2)
	require.NoError(t, err)
	v, ok := tab.Get(b)
	assert.True(t, ok)
	assert.Equal(t, 2, v)

	boom := errors.New("boom")
	_, err = tab.Create(func(*uintptr) error { return boom }, 3)
	assert.ErrorIs(t, err, boom)
	assert.ErrorContains(t, err, "fake: new stream")
	assert.Equal(t, 2, tab.Len())

	err = tab.Destroy(0x999, destroy)
	assert.ErrorIs(t, err, device.ErrInvalidValue)
	assert.Empty(t, destroyed, "an unknown handle is not passed to the runtime")

	require.NoError(t, tab.Destroy(a, destroy))
	_, ok = tab.Get(a)
	assert.False(t, ok)
	assert.ErrorIs(t, tab.Destroy(a, destroy), device.ErrInvalidValue, "twice")

	assert.ErrorIs(t, tab.DestroyAll(func(uintptr) error { return boom }), boom)
	assert.Zero(t, tab.Len())
}
