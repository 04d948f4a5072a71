package chameleon

import (
	"errors"

	"github.com/chameleon-go/chameleon/mre"
)

// The errors callers branch on, with errors.Is.
var (
	// ErrOutOfMemory is returned when a tensor cannot get device memory
	// even after every idle tensor the Engine may move has been swapped
	// out.
	ErrOutOfMemory = errors.New("chameleon: out of device memory")
	// ErrClosed is returned by every call on an Engine after Close.
	ErrClosed = errors.New("chameleon: engine closed")
	// ErrIterationUnderWay is the error of an Iteration that Begin
	// returned while another was under way: that one goes on untouched,
	// and this one runs nothing (End it, or drop it).
	ErrIterationUnderWay = errors.New("chameleon: Begin before the iteration under way ended")
	// ErrNoIteration is returned by an op or End outside Begin and End.
	ErrNoIteration = errors.New("chameleon: no iteration under way")
	// ErrOpUnderWay is returned by a Before, or an End, that comes while
	// an op's Before has had no After.
	ErrOpUnderWay = errors.New("chameleon: an op is under way")
	// ErrInfeasible is in a Result's PlanError when no policy meets the
	// limit, even with every idle activation moved (mre.ErrInfeasible;
	// errors.As with *mre.InfeasibleError says by how much, and where).
	ErrInfeasible = mre.ErrInfeasible
	// ErrInCallback is returned by a call into the Engine from inside an
	// Op.Recompute callback that would change it (NewTensor, Release,
	// Begin, an op, End, Evict, Prefetch, Fill, Close): the Engine is in
	// the middle of an op. Reads (Stats, Stage, Link, GroupTimes,
	// Simulation) are served.
	ErrInCallback = errors.New("chameleon: call into the Engine from an Op.Recompute callback")
	// ErrNoDevice is returned by Open when no accelerator runtime could
	// be loaded; it lists every place tried.
	ErrNoDevice = errors.New("chameleon: no device")
)
