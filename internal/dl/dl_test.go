package dl_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/internal/dl"
)

var errNotFound = errors.New("not found")

func TestOpen(t *testing.T) {
	_, err := dl.Open([]string{"", "libdoes-not-exist.so.0"}, errNotFound)
	require.ErrorIs(t, err, errNotFound)
	assert.ErrorContains(t, err, "libdoes-not-exist.so.0")

	l, err := dl.Open([]string{"libdoes-not-exist.so.0", "libc.so.6"}, errNotFound)
	require.NoError(t, err)
	assert.Equal(t, "libc.so.6", l.Path)
	again, err := dl.Open([]string{"libc.so.6"}, errNotFound)
	require.NoError(t, err)
	assert.Same(t, l, again, "cached")
	g, err := dl.OpenGlobal([]string{"libc.so.6"}, errNotFound)
	require.NoError(t, err)
	assert.NotSame(t, l, g, "opened again with RTLD_GLOBAL")
}

func TestBind(t *testing.T) {
	l, err := dl.Open([]string{"libc.so.6"}, errNotFound)
	require.NoError(t, err)

	_, err = l.Sym("chameleon_no_such_symbol")
	assert.ErrorIs(t, err, dl.ErrMissingSymbol)
	p, err := l.Sym("chameleon_no_such_symbol", "strlen")
	require.NoError(t, err)
	assert.NotZero(t, p)

	var strlen, missing func(*byte) uintptr
	err = l.Bind(dl.Func{Ptr: &strlen, Name: "strlen"}, dl.Func{Ptr: &missing, Name: "chameleon_no_such_symbol"})
	require.ErrorIs(t, err, dl.ErrMissingSymbol)
	assert.Nil(t, strlen, "nothing bound when one symbol is missing")

	require.NoError(t, l.Bind(dl.Func{Ptr: &strlen, Name: "chameleon_no_such_symbol", Alt: []string{"strlen"}}))
	s := dl.CString("chameleon")
	assert.Equal(t, uintptr(9), strlen(&s[0]))
	assert.Equal(t, "chameleon", dl.GoString(&s[0]))
	assert.Empty(t, dl.GoString(nil))
}
