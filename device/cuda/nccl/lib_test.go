package nccl

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/internal/dl"
)

func TestCandidates(t *testing.T) {
	t.Setenv(EnvLibrary, "/env/libnccl.so.2")
	t.Setenv(envCudart, "/cudart/lib/libcudart.so.12")
	c := candidates("/opt/libnccl.so")
	want := []string{"/opt/libnccl.so", "/env/libnccl.so.2", "libnccl.so.2", "libnccl.so",
		"/cudart/lib/libnccl.so.2", "/cudart/lib/libnccl.so"}
	require.Equal(t, want, c[:len(want)])
	rest := c[len(want):]
	require.Len(t, rest, len(Dirs)*len(Names))
	for i, d := range Dirs {
		for j, n := range Names {
			assert.Equal(t, filepath.Join(d, n), rest[i*len(Names)+j])
		}
	}

	t.Setenv(EnvLibrary, "")
	t.Setenv(envCudart, "")
	assert.Equal(t, []string{"libnccl.so.2", "libnccl.so", filepath.Join(Dirs[0], Names[0])}, candidates("")[:3])
}

func TestOpenNamesEveryPlaceTried(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(EnvLibrary, filepath.Join(dir, "env", "libnccl.so.2"))
	t.Setenv(envCudart, filepath.Join(dir, "cudart", "libcudart.so"))
	opt := filepath.Join(dir, "opt", "libnccl.so.2")
	l, err := Open(WithLibrary(opt))
	if err == nil {
		t.Skipf("a real libnccl loads from %s", l.Path())
	}
	require.ErrorIs(t, err, ErrLibrary)
	require.ErrorIs(t, err, device.ErrLibraryNotFound)
	for _, c := range candidates(opt) {
		assert.Contains(t, err.Error(), c+" (", "the error names %s with the loader's reason", c)
	}
}

func TestOpen(t *testing.T) {
	path := buildFake(t, "default")
	t.Setenv(EnvLibrary, path)
	l, err := Open()
	require.NoError(t, err)
	assert.Equal(t, path, l.Path())

	again, err := Open(WithLibrary(path), nil, WithLibrary(""))
	require.NoError(t, err)
	assert.Same(t, l, again, "one Library per file")

	// The option comes before the environment.
	t.Setenv(EnvLibrary, filepath.Join(t.TempDir(), "missing.so"))
	l, err = Open(WithLibrary(path))
	require.NoError(t, err)
	assert.Equal(t, path, l.Path())
}

func TestOpenMissingSymbol(t *testing.T) {
	path := buildFake(t, "noallreduce", "-DOMIT_ALLREDUCE")
	_, err := Open(WithLibrary(path))
	require.ErrorIs(t, err, ErrLibrary)
	require.ErrorIs(t, err, dl.ErrMissingSymbol)
	assert.ErrorContains(t, err, "ncclAllReduce")
	assert.ErrorContains(t, err, path)
}

func TestVersion(t *testing.T) {
	l, _ := newFake(t)
	v, err := l.Version()
	require.NoError(t, err)
	assert.Equal(t, Version(22703), v)
	assert.Equal(t, "2.27.3", v.String())
	assert.Equal(t, []int{2, 27, 3}, []int{v.Major(), v.Minor(), v.Patch()})
	assert.Equal(t, "2.8.4", Version(2804).String(), "the encoding before 2.9")

	old, _ := newFakeVariant(t, "old", "-DOMIT_SCALABLE", "-DFAKE_VERSION=21805")
	v, err = old.Version()
	require.NoError(t, err)
	assert.Equal(t, "2.18.5", v.String())
}

func TestErrors(t *testing.T) {
	l, ctl := newFake(t)
	ctl.failNext("ncclGetVersion", int32(InvalidUsage))
	_, err := l.Version()
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, InvalidUsage, e.Code)
	assert.Equal(t, "ncclGetVersion", e.Call)
	assert.Equal(t, "invalid usage (run with NCCL_DEBUG=WARN for details)", e.Text, "ncclGetErrorString")
	assert.Equal(t, "fake: injected failure in ncclGetVersion", e.Last, "ncclGetLastError")
	assert.ErrorIs(t, err, ErrInvalidUsage)
	assert.ErrorIs(t, err, InvalidUsage)
	assert.ErrorIs(t, err, device.ErrInvalidValue)
	assert.NotErrorIs(t, err, ErrTimeout)
	assert.Equal(t, "nccl: ncclGetVersion: ncclInvalidUsage (5): invalid usage (run with NCCL_DEBUG=WARN for details) (fake: injected failure in ncclGetVersion)", err.Error())

	for code, sentinel := range map[Result]error{
		UnhandledCudaError: ErrUnhandledCuda, SystemError: ErrSystem, InternalError: ErrInternal,
		InvalidArgument: ErrInvalidArgument, RemoteError: ErrRemote, InProgress: ErrInProgress, Timeout: ErrTimeout,
	} {
		ctl.failNext("", int32(code))
		_, err := l.Version()
		assert.ErrorIs(t, err, sentinel, code.Name())
		assert.ErrorContains(t, err, code.Name())
	}
	assert.Equal(t, "ncclResult(42)", Result(42).Name())
	assert.False(t, errors.Is(Timeout, device.ErrInvalidValue))

	// Without ncclGetLastError the message is the code's text alone.
	nolast, ctl2 := newFakeVariant(t, "nolast", "-DOMIT_LAST_ERROR")
	ctl2.failNext("ncclGetUniqueId", int32(SystemError))
	_, err = nolast.UniqueID()
	require.ErrorAs(t, err, &e)
	assert.Empty(t, e.Last)
	assert.Equal(t, "nccl: ncclGetUniqueId: ncclSystemError (2): unhandled system error (run with NCCL_DEBUG=INFO for details)", err.Error())
}
