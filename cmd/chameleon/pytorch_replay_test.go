package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pytorchTestdata holds the PyTorch Execution Traces the importer is
// tested on, each beside the Kineto profile of its step.
const pytorchTestdata = "../../trace/pytorch/testdata"

// pytorchPairs lists the Execution Traces of dir that have a Kineto
// companion (NAME.et.json[.gz] beside NAME.kineto.json[.gz]), each with it.
func pytorchPairs(t *testing.T, dir string) [][2]string {
	t.Helper()
	ets, err := filepath.Glob(filepath.Join(dir, "*.et.json*"))
	require.NoError(t, err)
	var pairs [][2]string
	for _, et := range ets {
		stem := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(et), ".gz"), ".et.json")
		for _, k := range []string{stem + ".kineto.json.gz", stem + ".kineto.json"} {
			if p := filepath.Join(dir, k); pytorchFileExists(p) {
				pairs = append(pairs, [2]string{et, p})
				break
			}
		}
	}
	return pairs
}

func pytorchFileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// Every imported PyTorch step replays with every byte it reads being the
// bytes last written: at the default limit (swaps) and at 100% (none). An
// op named as a view that copied into a new storage (a reshape of strides
// that allow no view) must write its output, or the ops reading it see
// bytes nobody produced (48 failed uses on llama4-small before).
func TestPyTorchTestdataReplays(t *testing.T) {
	pairs := pytorchPairs(t, pytorchTestdata)
	require.NotEmpty(t, pairs, "no Execution Trace with a Kineto companion in %s", pytorchTestdata)
	for _, p := range pairs {
		for _, limit := range []string{"", "100%"} {
			name := filepath.Base(p[0]) + "/limit=" + limit
			if limit == "" {
				name = filepath.Base(p[0]) + "/default-limit"
			}
			t.Run(name, func(t *testing.T) {
				// One round: a one-iteration trace would be repeated until a
				// policy is planned, and the bytes are what this checks.
				args := []string{"replay", "--trace", p[0], "--kineto", p[1], "--json", "--quiet", "--rounds", "1"}
				if limit != "" {
					args = append(args, "--limit", limit)
				}
				var out, errb bytes.Buffer
				code := runMain(args, &out, &errb)
				require.Equal(t, 0, code, "replay %s: %s", strings.Join(args[1:], " "), errb.String())
				var rep struct {
					Iterations   int `json:"iterations"`
					VerifiedUses int `json:"verified_uses"`
					FailedUses   int `json:"failed_uses"`
				}
				require.NoError(t, json.Unmarshal(out.Bytes(), &rep), out.String())
				assert.Equal(t, 1, rep.Iterations)
				assert.Zero(t, rep.FailedUses, "uses that read bytes differing from what was written: %s", errb.String())
				assert.Positive(t, rep.VerifiedUses)
			})
		}
	}
}
