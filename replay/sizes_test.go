package replay_test

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/replay"
	"github.com/chameleon-go/chameleon/trace"
)

func TestScaled(t *testing.T) {
	tests := []struct {
		b, scale int64
		want     int64
		wantErr  string
	}{
		{b: 0, scale: 1, want: 16},
		{b: 1000, scale: 1, want: 1000},
		{b: 1025, scale: 1024, want: 16},
		{b: 1 << 20, scale: 1024, want: 1024},
		{b: 1<<20 + 1, scale: 1024, want: 1025},
		{b: math.MaxInt64, scale: 2, want: math.MaxInt64/2 + 1},
		{b: math.MaxInt64, scale: 1, wantErr: "overflows"},
		{b: math.MaxInt64 - 100, scale: 1, wantErr: "overflows"},
		{b: -1, scale: 1, wantErr: "negative"},
		{b: 1, scale: 0, wantErr: "scale"},
	}
	for _, tt := range tests {
		got, err := replay.Scaled(tt.b, tt.scale)
		if tt.wantErr != "" {
			require.Error(t, err, "%d / %d", tt.b, tt.scale)
			assert.Contains(t, err.Error(), tt.wantErr)
			continue
		}
		require.NoError(t, err)
		assert.Equal(t, tt.want, got, "%d / %d", tt.b, tt.scale)
	}
}

// sizedTrace is one op producing one tensor of the given size.
func sizedTrace(t *testing.T, bytes string) *trace.Trace {
	t.Helper()
	in := `{"type":"header","format":"optrace/v1"}
{"type":"tensor","id":7,"bytes":` + bytes + `,"kind":"act"}
{"type":"op","iter":0,"seq":0,"name":"aten::empty","phase":"fwd","out":[7],"mem":1048576}
{"type":"iter_end","iter":0,"ops":1}
{"type":"footer"}
`
	tr, err := trace.Read(strings.NewReader(in), "sizes.jsonl")
	require.NoError(t, err)
	return tr
}

// codeTrace is the same built in code: no file lines, and no reader to
// refuse impossible sizes.
func codeTrace(bytes int64) *trace.Trace {
	tt := &trace.Tensor{ID: 7, Bytes: bytes, Kind: trace.KindActivation}
	return &trace.Trace{Name: "code", Iterations: []*trace.Iteration{{
		Ops:     []trace.Op{{Name: "aten::empty", Phase: trace.PhaseForward, Out: []trace.TensorID{7}, Mem: 1 << 20}},
		Tensors: map[trace.TensorID]*trace.Tensor{7: tt},
	}}}
}

// Every size is checked before the Engine allocates anything, and a refusal
// names the tensor and where it came from.
func TestSizesAreRefusedWithTheirOrigin(t *testing.T) {
	tests := []struct {
		name     string
		tr       *trace.Trace
		scale    int64
		capacity int64 // of the host device
		limit    int64
		from     string
		want     []string
	}{
		{name: "tensor above the limit", tr: sizedTrace(t, "4398046511104"), scale: 1, capacity: 1 << 20, limit: 1 << 20,
			want: []string{"tensor 7 (4398046511104 bytes, declared at sizes.jsonl:2)", "larger than the device limit of 1048576 bytes"}},
		{name: "tensor above the limit once rounded", tr: sizedTrace(t, "1048065"), scale: 1, capacity: 1 << 20, limit: 1<<20 - 1,
			want: []string{"tensor 7", "sizes.jsonl:2", "larger than the device limit"}},
		{name: "rounding overflows", tr: codeTrace(math.MaxInt64), scale: 1, capacity: 1 << 20, limit: 1 << 20,
			want: []string{"tensor 7 (9223372036854775807 bytes, declared at code)", "overflows"}},
		{name: "negative", tr: codeTrace(-5), scale: 1, capacity: 1 << 20, limit: 1 << 20,
			want: []string{"tensor 7 (-5 bytes, declared at code)", "negative"}},
		{name: "limit above the device", tr: sizedTrace(t, "1024"), scale: 1, capacity: 1 << 20, limit: 1 << 21, from: "--limit 2MiB",
			want: []string{"limit 2097152 bytes (--limit 2MiB)", "larger than host (1048576 bytes)"}},
		{name: "limit above the machine", tr: sizedTrace(t, "1024"), scale: 1, capacity: 1 << 47, limit: 1 << 47, from: "80% of the peak recorded at sizes.jsonl:3",
			want: []string{"limit 140737488355328 bytes (80% of the peak recorded at sizes.jsonl:3)", "out of memory"}},
		{name: "limit zero", tr: sizedTrace(t, "1024"), scale: 1, capacity: 1 << 20, limit: 0,
			want: []string{"limit 0 bytes", "positive"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dev, err := host.New(tt.capacity)
			require.NoError(t, err)
			defer dev.Close()
			rep, err := replay.Run(tt.tr, dev, replay.Config{Scale: tt.scale, Limit: tt.limit, LimitFrom: tt.from})
			if rep != nil && rep.Engine != nil {
				defer rep.Engine.Close()
			}
			require.Error(t, err)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.Zero(t, dev.PeakAllocated(), "allocated before refusing")
		})
	}
}

// At the limit exactly, the tensor is replayed.
func TestSizeAtTheLimitReplays(t *testing.T) {
	dev, err := host.New(1 << 20)
	require.NoError(t, err)
	defer dev.Close()
	rep, err := replay.Run(sizedTrace(t, "1048576"), dev, replay.Config{Scale: 1, Limit: 1 << 20})
	require.NoError(t, err)
	defer rep.Engine.Close()
	assert.Zero(t, rep.FailedUses)
}
