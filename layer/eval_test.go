package layer

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/chameleon-go/chameleon/internal/testtraces"
	"github.com/chameleon-go/chameleon/trace"
)

// tracesDir is ../shared/traces beside the checkout, or "".
func tracesDir() string { return testtraces.Dir() }

// repoFile is a file relative to the repository root.
func repoFile(t testing.TB, rel string) string {
	root := testtraces.Root()
	if root == "" {
		t.Fatal("no go.mod above the test directory")
	}
	return filepath.Join(root, rel)
}

var traceCache = map[string]*trace.Trace{}

func loadTrace(t testing.TB, path string) *trace.Trace {
	if tr, ok := traceCache[path]; ok {
		return tr
	}
	tr, err := trace.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	traceCache[path] = tr
	return tr
}

// syncFloor is the launch-and-sync floor of dur_us: the median duration of
// ops that launch no kernel.
func syncFloor(it *trace.Iteration) float64 {
	var v []float64
	for i := range it.Ops {
		if Classify(it, &it.Ops[i]) == KindView {
			v = append(v, it.Ops[i].DurUS)
		}
	}
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// durTruth is dur_us minus the sync floor, floored at zero.
func durTruth(it *trace.Iteration) []float64 {
	f := syncFloor(it)
	out := make([]float64, len(it.Ops))
	for i := range it.Ops {
		out[i] = max(0, it.Ops[i].DurUS-f)
	}
	return out
}

func rawDur(it *trace.Iteration) []float64 {
	out := make([]float64, len(it.Ops))
	for i := range it.Ops {
		out[i] = it.Ops[i].DurUS
	}
	return out
}

// kernelsFor returns per-op kernel times when the kernels file matches the
// iteration's op sequence.
func kernelsFor(k *trace.Kernels, it *trace.Iteration) []float64 {
	if k == nil || len(k.Ops) != len(it.Ops) {
		return nil
	}
	out := make([]float64, len(it.Ops))
	for i, ko := range k.Ops {
		if ko.Name != it.Ops[i].Name {
			return nil
		}
		out[i] = ko.KernelUS
	}
	return out
}

func scaleTo(x []float64, targetUS float64) []float64 {
	var s float64
	for _, v := range x {
		s += v
	}
	out := make([]float64, len(x))
	if s == 0 {
		return out
	}
	for i, v := range x {
		out[i] = v * targetUS / s
	}
	return out
}

// groupErr returns the mean and max relative error of group estimates.
func groupErr(groups []Group, est, truth []float64) (mean, worst float64) {
	e := GroupTimes(groups, est)
	tr := GroupTimes(groups, truth)
	n := 0
	for g := range groups {
		if tr[g] <= 0 {
			continue
		}
		r := math.Abs(e[g]-tr[g]) / tr[g]
		mean += r
		worst = max(worst, r)
		n++
	}
	if n > 0 {
		mean /= float64(n)
	}
	return mean, worst
}

var _ = fmt.Sprintf
var _ = strings.Cut
