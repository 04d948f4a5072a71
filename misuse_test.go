package chameleon_test

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device/host"
)

// TestMisuseIsAnError: a careless caller gets an error, never a panic or a
// silent corruption.
func TestMisuseIsAnError(t *testing.T) {
	dev, err := host.New(1 << 20)
	require.NoError(t, err)
	defer dev.Close()
	newEngine := func() *chameleon.Engine {
		e, err := chameleon.New(dev, chameleon.WithMemoryLimit(256<<10))
		require.NoError(t, err)
		return e
	}
	a, b := newEngine(), newEngine()
	defer a.Close()
	defer b.Close()
	ta, err := a.NewTensor(1024, chameleon.Activation, "uint8", []int64{1024})
	require.NoError(t, err)

	it := b.Begin()
	assert.ErrorContains(t, it.Before(nil), "nil")
	assert.ErrorContains(t, it.Before(&chameleon.Op{Name: "x", In: []*chameleon.Tensor{nil}}), "nil")
	assert.ErrorContains(t, it.Before(&chameleon.Op{Name: "x", In: []*chameleon.Tensor{ta}}), "another Engine")
	assert.ErrorContains(t, b.Release(ta), "another Engine")

	again := b.Begin()
	assert.ErrorContains(t, again.Before(&chameleon.Op{Name: "y"}), "Begin")
	assert.Error(t, again.End().Err, "the second Begin is reported")
	assert.NoError(t, it.Before(&chameleon.Op{Name: "y"}), "the iteration under way goes on")
	assert.NoError(t, it.After(&chameleon.Op{Name: "y"}))
	assert.NoError(t, it.End().Err)
	assert.Error(t, it.End().Err, "End without Begin")
	assert.ErrorContains(t, it.After(&chameleon.Op{Name: "z"}), "outside Begin and End")

	require.NoError(t, a.Release(ta))
	require.NoError(t, b.Close())
	_, err = b.NewTensor(1024, chameleon.Activation, "uint8", nil)
	assert.ErrorIs(t, err, chameleon.ErrClosed)
	closed := b.Begin()
	assert.ErrorIs(t, closed.Before(&chameleon.Op{Name: "w"}), chameleon.ErrClosed)
	assert.ErrorIs(t, closed.After(&chameleon.Op{Name: "w"}), chameleon.ErrClosed)
	assert.ErrorIs(t, closed.End().Err, chameleon.ErrClosed)
}

// TestStrayBeginDoesNotJam: a Begin while an iteration is under way gets
// an Iteration of its own that runs nothing (ErrIterationUnderWay); the
// one under way, and every iteration after it, run as if it had not come.
// An iteration whose End comes without its ops ends all the same.
func TestStrayBeginDoesNotJam(t *testing.T) {
	dev, err := host.New(1 << 20)
	require.NoError(t, err)
	defer dev.Close()
	e, err := chameleon.New(dev, chameleon.WithMemoryLimit(256<<10))
	require.NoError(t, err)
	defer e.Close()
	step := func(it *chameleon.Iteration) chameleon.Result {
		x, err := e.NewTensor(1024, chameleon.Activation, "uint8", []int64{1024})
		require.NoError(t, err)
		op := &chameleon.Op{Name: "fill", Out: []*chameleon.Tensor{x}}
		require.NoError(t, it.Before(op))
		require.NoError(t, it.After(op))
		require.NoError(t, e.Release(x))
		return it.End()
	}
	it := e.Begin()
	stray := e.Begin()
	assert.ErrorIs(t, stray.Before(&chameleon.Op{Name: "x"}), chameleon.ErrIterationUnderWay)
	assert.ErrorIs(t, stray.End().Err, chameleon.ErrIterationUnderWay)
	require.NoError(t, step(it).Err)
	for i := range 3 {
		assert.NoError(t, step(e.Begin()).Err, "iteration %d after the stray Begin", i)
	}
	assert.ErrorIs(t, e.Begin().End().Err, nil, "an iteration of no op")
	assert.ErrorIs(t, it.End().Err, chameleon.ErrNoIteration)
	assert.Equal(t, 5, e.Stats().Iterations)
}

// TestOpMisuseIsRefused: an op's calls out of order, a release of a tensor
// the op under way lists, a kind or shape that means nothing: each is an
// error that says what, and the loop goes on.
func TestOpMisuseIsRefused(t *testing.T) {
	dev, err := host.New(1 << 20)
	require.NoError(t, err)
	defer dev.Close()
	e, err := chameleon.New(dev, chameleon.WithMemoryLimit(256<<10))
	require.NoError(t, err)
	defer e.Close()
	_, err = e.NewTensor(1024, chameleon.Kind(200), "uint8", nil)
	assert.ErrorContains(t, err, "kind 200")
	_, err = e.NewTensor(1024, chameleon.Activation, "uint8", []int64{4, -256})
	assert.ErrorContains(t, err, "dimension 1 is negative")

	x, err := e.NewTensor(1024, chameleon.Activation, "uint8", []int64{1024})
	require.NoError(t, err)
	op := &chameleon.Op{Name: "relu", In: []*chameleon.Tensor{x}}
	it := e.Begin()
	assert.ErrorContains(t, it.After(op), "without its Before")
	require.NoError(t, it.Before(op))
	assert.ErrorIs(t, it.Before(op), chameleon.ErrOpUnderWay, "Before twice")
	assert.ErrorContains(t, e.Release(x), "the op under way lists it")
	require.NoError(t, it.After(op))
	require.NoError(t, it.End().Err)

	// End in the middle of an op ends the iteration, refused.
	it = e.Begin()
	require.NoError(t, it.Before(op))
	assert.ErrorIs(t, it.End().Err, chameleon.ErrOpUnderWay)
	it = e.Begin()
	require.NoError(t, it.Before(op), "the next iteration runs")
	require.NoError(t, it.After(op))
	require.NoError(t, it.End().Err)
	require.NoError(t, e.Release(x))
}

// TestPolicyFileAfterClose: saving or loading policies after Close is
// ErrClosed, and a policy file over the cap is refused unread.
func TestPolicyFileAfterClose(t *testing.T) {
	dev, err := host.New(1 << 20)
	require.NoError(t, err)
	defer dev.Close()
	e, err := chameleon.New(dev, chameleon.WithMemoryLimit(256<<10))
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "p.json")
	big, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, big.Truncate(513<<20)) // sparse: nothing is read
	require.NoError(t, big.Close())
	assert.ErrorContains(t, e.LoadPolicyFile(path), "larger than the")
	require.NoError(t, e.Close())
	assert.ErrorIs(t, e.SavePolicyFile(path), chameleon.ErrClosed)
	assert.ErrorIs(t, e.LoadPolicyFile(path), chameleon.ErrClosed)
	assert.ErrorIs(t, e.SavePolicies(io.Discard), chameleon.ErrClosed)
}
