package main

import (
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeGzipTrace writes a one-op trace whose tensor and op sizes are given.
func writeGzipTrace(t *testing.T, bytesField, mem string) string {
	t.Helper()
	lines := []string{
		`{"type":"header","format":"optrace/v1","model":"m"}`,
		`{"type":"tensor","id":0,"bytes":` + bytesField + `,"dtype":"float32","shape":[4],"kind":"act","ptr":1}`,
		`{"type":"op","iter":0,"seq":0,"name":"aten::mm","phase":"fwd","in":[],"out":[0],"mem":` + mem + `}`,
		`{"type":"iter_end","iter":0,"ops":1}`,
		`{"type":"footer"}`,
	}
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, err := zw.Write([]byte(strings.Join(lines, "\n") + "\n"))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	path := filepath.Join(t.TempDir(), "sizes.jsonl.gz")
	require.NoError(t, os.WriteFile(path, b.Bytes(), 0o644))
	return path
}

// Impossible sizes end the replay with an error naming the file and line,
// never a panic or the runtime's fatal out of memory.
func TestReplayRefusesImpossibleSizes(t *testing.T) {
	tests := []struct {
		name, bytes, mem string
		args             []string
		want             []string
	}{
		{name: "tensor of MaxInt64 bytes", bytes: "9223372036854775807", mem: "1024", args: []string{"--scale", "1"},
			want: []string{"sizes.jsonl.gz:2", `field "bytes"`}},
		{name: "mem of 1e18", bytes: "1024", mem: "1000000000000000000",
			want: []string{"sizes.jsonl.gz:3", `field "mem"`}},
		{name: "tensor larger than the device", bytes: "4398046511104", mem: "1048576", args: []string{"--scale", "1"},
			want: []string{"tensor 0 (4398046511104 bytes, declared at sizes.jsonl.gz:2)", "larger than the device limit"}},
		{name: "peak larger than the machine", bytes: "1024", mem: "4398046511104", args: []string{"--scale", "1"},
			want: []string{"of the peak of 4398046511104 bytes recorded at", "sizes.jsonl.gz:3", "more than this machine can allocate"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeGzipTrace(t, tt.bytes, tt.mem)
			var out, errb bytes.Buffer
			code := runMain(append([]string{"replay", "--trace", path, "--quiet"}, tt.args...), &out, &errb)
			assert.NotEqual(t, 0, code)
			for _, w := range tt.want {
				assert.Contains(t, errb.String(), w)
			}
		})
	}
}
