package layer

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/trace"
)

var layerRe = regexp.MustCompile(`layers\.(\d+)`)

// moduleStarts is the ground truth from module paths: for each layer index
// seen in the phase run, the first op of its longest run of labelled ops
// (ops without a layer label, like AccumulateGrad, do not break a run). The
// longest run skips stray labels, such as a loss op tagged with the module
// that ran last.
func moduleStarts(ops []trace.Op, r Group) []int {
	type run struct{ first, n int }
	best := map[int]run{}
	cur, curFirst, curN := -1, 0, 0
	flush := func() {
		if cur >= 0 && curN > best[cur].n {
			best[cur] = run{curFirst, curN}
		}
	}
	for i := r.First; i <= r.Last; i++ {
		m := layerRe.FindStringSubmatch(ops[i].Module)
		if m == nil {
			continue
		}
		l, _ := strconv.Atoi(m[1])
		if l != cur {
			flush()
			cur, curFirst, curN = l, i, 0
		}
		curN++
	}
	flush()
	var starts []int
	for _, b := range best {
		starts = append(starts, b.first)
	}
	return starts
}

// matchBoundaries counts truth starts that a discovered group starts at
// exactly, and within tol ops.
func matchBoundaries(ops []trace.Op, groups []Group, tol int) (truth, exact, near int) {
	for _, r := range phaseRuns(ops) {
		if r.Phase != trace.PhaseForward && r.Phase != trace.PhaseBackward {
			continue
		}
		for _, s := range moduleStarts(ops, r) {
			truth++
			d := len(ops)
			for _, g := range groups {
				if g.Phase == r.Phase {
					d = min(d, abs(g.First-s))
				}
			}
			if d == 0 {
				exact++
			}
			if d <= tol {
				near++
			}
		}
	}
	return
}

func TestDiscoverMatchesModulePaths(t *testing.T) {
	dir := tracesDir()
	files := map[string]string{"llama4-small": repoFile(t, "testdata/llama4-small.jsonl.gz")}
	if dir != "" {
		for _, n := range publicTraces {
			if p := filepath.Join(dir, n+".jsonl.gz"); fileExists(p) {
				files[n] = p
			}
		}
	}
	// Gradient checkpointing wraps each layer in two ops that the recorder
	// tags with the model, not the layer; tokens see them as part of the
	// repeated block, so those boundaries land up to 2 ops early.
	tol := map[string]int{"llama16-bf16-ckpt": 2}
	for name, p := range files {
		tr := loadTrace(t, p)
		var truth, exact, near int
		for _, it := range tr.Iterations {
			ops := stripModules(it.Ops)
			gs := Discover(ops)
			checkCover(t, gs, len(ops))
			a, b, c := matchBoundaries(it.Ops, gs, tol[name])
			truth, exact, near = truth+a, exact+b, near+c
		}
		t.Logf("%-22s layer starts %4d: exact %4d, within %d ops %4d", name, truth, exact, tol[name], near)
		require.Positive(t, truth, name)
		assert.Equal(t, truth, near, "%s: discovered boundaries vs module paths", name)
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// stripModules proves that Discover uses the tokens only.
func stripModules(ops []trace.Op) []trace.Op {
	out := make([]trace.Op, len(ops))
	for i, op := range ops {
		op.Module = ""
		op.In, op.Out = nil, nil
		out[i] = op
	}
	return out
}

// checkCover asserts the grouping invariants: groups are consecutive,
// non-empty, cover every op, and never span two phases.
func checkCover(t *testing.T, gs []Group, n int) {
	t.Helper()
	next := 0
	for _, g := range gs {
		require.Equal(t, next, g.First, "groups must be consecutive")
		require.LessOrEqual(t, g.First, g.Last, "empty group")
		next = g.Last + 1
	}
	require.Equal(t, n, next, "groups must cover every op")
}

func TestLayersMergesToAtMostN(t *testing.T) {
	tr := loadTrace(t, repoFile(t, "testdata/llama4-small.jsonl.gz"))
	it := tr.Iterations[0]
	disc := Discover(it.Ops)
	for _, n := range []int{0, 1, 2, 3, 4, 8, 64} {
		gs := Layers(it.Ops, n)
		checkCover(t, gs, len(it.Ops))
		per := map[trace.Phase]int{}
		for _, g := range gs {
			per[g.Phase]++
			// every cut is a discovered boundary
			found := false
			for _, d := range disc {
				found = found || d.First == g.First
			}
			assert.True(t, found, "n=%d: group at %d is not on a layer boundary", n, g.First)
		}
		assert.LessOrEqual(t, per[trace.PhaseForward], max(n, 1))
		assert.LessOrEqual(t, per[trace.PhaseBackward], max(n, 1))
	}
}

func TestDiscoverNoRepetitionFallsBack(t *testing.T) {
	var ops []trace.Op
	for i := range 40 {
		ops = append(ops, trace.Op{Seq: i, Name: "aten::op" + strconv.Itoa(i), Phase: trace.PhaseForward})
	}
	gs := Discover(ops)
	assert.Equal(t, []Group{{Phase: trace.PhaseForward, First: 0, Last: 39}}, gs)
	assert.Equal(t, Uniform(ops, 4), Layers(ops, 4))
}

func TestDiscoverSynthetic(t *testing.T) {
	// prologue, 5 blocks of a layer whose middle loop varies in
	// length, epilogue; then the mirror image in backward.
	var ops []trace.Op
	add := func(ph trace.Phase, names ...string) {
		for _, n := range names {
			ops = append(ops, trace.Op{Seq: len(ops), Name: n, Phase: ph})
		}
	}
	head := []string{"norm", "pow", "mean", "rsqrt", "mul", "mm", "view", "mm", "view", "mm", "view",
		"rope", "attn", "view", "mm", "add", "norm", "pow", "mean", "rsqrt", "mul", "router", "topk", "softmax"}
	add(trace.PhaseForward, "embed", "arange", "cos", "sin")
	var want []int
	for l := range 5 {
		want = append(want, len(ops))
		add(trace.PhaseForward, head...)
		for range 2 + l%3 { // expert loop of varying trips
			add(trace.PhaseForward, "index", "mm", "silu", "mm", "index_add")
		}
		add(trace.PhaseForward, "add2")
	}
	add(trace.PhaseForward, "final", "logits", "loss")
	gs := Discover(ops)
	var got []int
	for _, g := range gs[1 : len(gs)-1] {
		got = append(got, g.First)
	}
	assert.Equal(t, want, got)
	assert.Equal(t, 0, gs[0].First)
	assert.Equal(t, len(ops)-3, gs[len(gs)-1].First, "epilogue")
}
