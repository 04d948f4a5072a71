package chameleon_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/internal/testtraces"
	"github.com/chameleon-go/chameleon/replay"
	"github.com/chameleon-go/chameleon/seq"
	"github.com/chameleon-go/chameleon/trace"
)

// savedRecompute replays the bundled trace at 85% of its peak with
// recomputes (an iteration takes 5 µs, so they pay) and returns the policy
// file its Engine saves.
func savedRecompute(t *testing.T) []byte {
	t.Helper()
	tr := testtraces.Read(t, testtraces.Small)
	var now int64
	clock := func() time.Time { now += 5e3; return time.Unix(0, now) }
	rep := restartRC(t, tr, 1024, replay.PeakBytes(tr)/1024*85/100, 2, "", true, chameleon.WithClock(clock))
	require.Equal(t, 1, rep.Engine.CachedPolicies())
	var b bytes.Buffer
	require.NoError(t, rep.Engine.SavePolicies(&b))
	return b.Bytes()
}

func loadInto(t *testing.T, data []byte, name string) (int, error) {
	t.Helper()
	dev, err := host.New(2 << 20)
	require.NoError(t, err)
	defer dev.Close()
	eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(2<<20))
	require.NoError(t, err)
	defer eng.Close()
	err = eng.LoadPolicies(bytes.NewReader(data), name)
	return eng.CachedPolicies(), err
}

// TestPolicyFileSaveInterrupted: a save interrupted at any of its writes,
// its sync, close, rename or the directory's sync leaves the file it
// replaces whole and loadable, and no temporary file behind.
func TestPolicyFileSaveInterrupted(t *testing.T) {
	old, _ := replaySmall(t, 0.85, 2)
	next, _ := replaySmall(t, 0.8, 2)
	dir := t.TempDir()
	path := filepath.Join(dir, "policies.json")
	require.NoError(t, old.Engine.SavePolicyFile(path))
	want, err := os.ReadFile(path)
	require.NoError(t, err)

	var steps []string
	restore := chameleon.SetPolicySaveStep(4096, func(what string) error { steps = append(steps, what); return nil })
	require.NoError(t, next.Engine.SavePolicyFile(filepath.Join(t.TempDir(), "count.json")))
	restore()
	require.Greater(t, len(steps), 20, "the save is cut into many writes")

	crash := errors.New("crash")
	for k := range steps {
		n := 0
		restore := chameleon.SetPolicySaveStep(4096, func(string) error {
			if n++; n > k {
				return crash
			}
			return nil
		})
		err := next.Engine.SavePolicyFile(path)
		restore()
		require.ErrorIs(t, err, crash, "step %d (%s)", k, steps[k])
		assert.Contains(t, err.Error(), path)
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		if steps[k] == "syncdir" {
			// Renamed already: the new file is whole.
			cached, err := loadInto(t, got, path)
			require.NoError(t, err)
			assert.Equal(t, 1, cached)
			require.NoError(t, os.WriteFile(path, want, 0o644))
		} else {
			require.Equal(t, want, got, "interrupted at step %d (%s): the old file changed", k, steps[k])
		}
		ents, err := os.ReadDir(dir)
		require.NoError(t, err)
		require.Len(t, ents, 1, "interrupted at step %d (%s): a temporary file is left", k, steps[k])
	}
	cached, err := loadInto(t, want, path)
	require.NoError(t, err)
	assert.Equal(t, 1, cached)
	require.NoError(t, next.Engine.SavePolicyFile(path))
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.NotEqual(t, want, got, "an uninterrupted save replaces the file")
}

// mutate applies f to the JSON of a policy file.
func mutate(t *testing.T, data []byte, f func(m map[string]any)) []byte {
	t.Helper()
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	require.NoError(t, dec.Decode(&m))
	f(m)
	out, err := json.Marshal(m)
	require.NoError(t, err)
	return out
}

func pol(m map[string]any) map[string]any { return m["policies"].([]any)[0].(map[string]any) }
func entry(m map[string]any, list string, i int) map[string]any {
	return pol(m)[list].([]any)[i].(map[string]any)
}

// TestPolicyFileRefusesBadFields: every field out of its range, an unknown
// tensor, a foreign or newer file, trailing data: refused with the file's
// name and the field's path, adding no policy.
func TestPolicyFileRefusesBadFields(t *testing.T) {
	good := savedRecompute(t)
	cached, err := loadInto(t, good, "good.json")
	require.NoError(t, err)
	require.Equal(t, 1, cached)

	set := func(list string, i int, field string, v any) func(m map[string]any) {
		return func(m map[string]any) { entry(m, list, i)[field] = v }
	}
	prof := func(f func(p map[string]any)) func(m map[string]any) {
		return func(m map[string]any) { f(pol(m)["profile"].(map[string]any)) }
	}
	cases := []struct {
		name, want string
		f          func(m map[string]any)
		raw        []byte
	}{
		{"unknown tensor", "policies[0].swaps[2].tensor", set("swaps", 2, "tensor", 1<<40), nil},
		{"negative swap bytes", "policies[0].swaps[0].bytes", set("swaps", 0, "bytes", -1), nil},
		{"swap bytes near 2^63", "policies[0].swaps[1].bytes", set("swaps", 1, "bytes", int64(1)<<62), nil},
		{"tensor above the device", "policies[0].tensors[3].bytes", set("tensors", 3, "bytes", int64(5)<<40), nil},
		{"tensor of no bytes", "policies[0].tensors[0].bytes", set("tensors", 0, "bytes", 0), nil},
		{"tensor kind", "policies[0].tensors[1].kind", set("tensors", 1, "kind", "weight"), nil},
		{"negative dimension", "policies[0].tensors[0].shape[0]", set("tensors", 0, "shape", []int{-4}), nil},
		{"tensor twice", "policies[0].tensors[1].id", func(m map[string]any) { entry(m, "tensors", 1)["id"] = entry(m, "tensors", 0)["id"] }, nil},
		{"negative byte key", "policies[0].key.bytes", func(m map[string]any) { pol(m)["key"].(map[string]any)["bytes"] = -64 }, nil},
		{"ops in the millions", "policies[0].key.ops", func(m map[string]any) { pol(m)["key"].(map[string]any)["ops"] = 50_000_000 }, nil},
		{"swap order", "policies[0].out_order[1]", func(m map[string]any) { o := pol(m)["out_order"].([]any); o[1] = o[0] }, nil},
		{"swap past the end", "policies[0].swaps[0]", set("swaps", 0, "in_before_op", 1_000_000), nil},
		{"issue out of its gap", "policies[0].swaps[0].issue_in_at_op", set("swaps", 0, "issue_in_at_op", -3), nil},
		{"recompute tensor", "policies[0].recomputes[0].tensor", set("recomputes", 0, "tensor", -7), nil},
		{"recompute ops", "policies[0].recomputes[0]", set("recomputes", 0, "before_op", 0), nil},
		{"limit", "policies[0].assumed.limit_bytes", func(m map[string]any) { pol(m)["assumed"].(map[string]any)["limit_bytes"] = 0 }, nil},
		{"link", "policies[0].assumed.link.d2h_bytes_per_s", func(m map[string]any) {
			pol(m)["assumed"].(map[string]any)["link"].(map[string]any)["d2h_bytes_per_s"] = -1
		}, nil},
		{"simulated step", "policies[0].simulated_ms", func(m map[string]any) { pol(m)["simulated_ms"] = -2 }, nil},
		{"profile op name", "policies[0].profile.ops[3].n", prof(func(p map[string]any) { p["ops"].([]any)[3].(map[string]any)["n"] = 99999 }), nil},
		{"profile op tensor", "policies[0].profile.ops[5].in[0]", prof(func(p map[string]any) {
			p["ops"].([]any)[5].(map[string]any)["in"] = []int{1 << 40}
		}), nil},
		{"profile phase", "policies[0].profile.ops[0].p", prof(func(p map[string]any) { p["ops"].([]any)[0].(map[string]any)["p"] = 9 }), nil},
		{"profile ops", "policies[0].profile.ops", prof(func(p map[string]any) { p["ops"] = p["ops"].([]any)[1:] }), nil},
		{"profile live out", "policies[0].profile.live_out[0]", prof(func(p map[string]any) { p["live_out"] = []int{-1} }), nil},
		{"profile tensor bytes", "policies[0].profile.tensors[2].bytes", prof(func(p map[string]any) {
			p["tensors"].([]any)[2].(map[string]any)["bytes"] = -9
		}), nil},
		{"unknown field", `unknown field "colour"`, func(m map[string]any) { pol(m)["colour"] = 1 }, nil},
		{"wrong type", "field policies.swaps.bytes", set("swaps", 0, "bytes", "many"), nil},
		{"newer version", "version: 3: this build reads versions 1 and 2", func(m map[string]any) { m["version"] = 3 }, nil},
		{"foreign file", `format: "other": not a policy file`, func(m map[string]any) { m["format"] = "other" }, nil},
		{"no format", "format: missing", nil, []byte(`{"policies":[]}`)},
		{"not JSON", "line 1", nil, []byte("\x1f\x8b\x08 gzip?")},
		{"empty", "truncated", nil, []byte{}},
		{"trailing garbage", "trailing data", nil, append(bytes.Clone(good), "{}"...)},
		{"cut short", "truncated", nil, good[:len(good)/2]},
	}
	dir := t.TempDir()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			data := c.raw
			if c.f != nil {
				data = mutate(t, good, c.f)
			}
			path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".json")
			cached, err := loadInto(t, data, path)
			require.Error(t, err)
			assert.Contains(t, err.Error(), path)
			assert.Contains(t, err.Error(), c.want)
			assert.Zero(t, cached, "a refused file adds no policy")
		})
	}
}

// TestPolicyFileDamagedWarns: by default a damaged file is a warning, on
// the Engine's logger and in PolicyFileError, and the Engine starts with
// an empty cache; WithStrictPolicyFile makes it New's error. A missing file
// is a first run either way.
func TestPolicyFileDamagedWarns(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"format":"chameleon-policies","version":2,"policies":[]} junk`), 0o644))
	dev, err := host.New(1 << 20)
	require.NoError(t, err)
	defer dev.Close()
	var log bytes.Buffer
	eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(1<<20), chameleon.WithPolicyFile(bad),
		chameleon.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	require.NoError(t, err)
	require.Error(t, eng.PolicyFileError())
	assert.Contains(t, eng.PolicyFileError().Error(), bad)
	assert.Contains(t, log.String(), "level=WARN")
	assert.Contains(t, log.String(), "trailing data")
	assert.Zero(t, eng.CachedPolicies())
	require.NoError(t, eng.Close())

	_, err = chameleon.New(dev, chameleon.WithMemoryLimit(1<<20), chameleon.WithPolicyFile(bad), chameleon.WithStrictPolicyFile())
	require.Error(t, err)
	assert.Contains(t, err.Error(), bad)

	for _, strict := range []bool{false, true} {
		opts := []chameleon.Option{chameleon.WithMemoryLimit(1 << 20), chameleon.WithPolicyFile(filepath.Join(dir, "none.json"))}
		if strict {
			opts = append(opts, chameleon.WithStrictPolicyFile())
		}
		eng, err := chameleon.New(dev, opts...)
		require.NoError(t, err, "a missing file is a first run")
		assert.NoError(t, eng.PolicyFileError())
		require.NoError(t, eng.Close())
	}
}

// TestPolicyFileReadsVersion1: a file of the first version (swaps of
// activations and what matches them) loads.
func TestPolicyFileReadsVersion1(t *testing.T) {
	v1 := []byte(`{"format":"chameleon-policies/v1","policies":[{"key":{"hash":7,"ops":4,"bytes":64},` +
		`"swaps":[{"tensor":3,"bytes":16,"out_after_op":0,"freed_at_op":1,"in_issue_op":2,"in_before_op":3}],` +
		`"tensors":[{"ptr":1,"producer":"aten::mm","overload":"default","module":"m","shape":[4]}]}]}`)
	cached, err := loadInto(t, v1, "v1.json")
	require.NoError(t, err)
	assert.Equal(t, 1, cached)
	_, err = loadInto(t, bytes.Replace(v1, []byte(`"in_issue_op":2`), []byte(`"in_issue_op":9`), 1), "v1.json")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "v1.json: policies[0].swaps[0]")
}

// restart replays tr at limit with the policy file path, one round.
func restart(t *testing.T, tr *trace.Trace, scale, limit int64, rounds int, path string, opts ...chameleon.Option) *replay.Report {
	t.Helper()
	dev, err := host.New(limit)
	require.NoError(t, err)
	t.Cleanup(func() { dev.Close() })
	d := seq.DefaultConfig()
	d.M, d.N = 2, 1
	rep, err := replay.Run(tr, dev, replay.Config{Scale: scale, Rounds: rounds, Limit: limit, PolicyFile: path,
		Options: append([]chameleon.Option{chameleon.WithDetection(d), chameleon.WithStrictPolicyFile()}, opts...)})
	require.NoError(t, err)
	t.Cleanup(func() { rep.Engine.Close() })
	assert.Zero(t, rep.FailedUses, rep.Failures)
	assert.LessOrEqual(t, dev.PeakAllocated(), limit)
	return rep
}

// stable is the per-iteration swaps and matches of a run's STABLE
// iterations.
func stable(rep *replay.Report) (swaps []int64, matched []int) {
	for _, r := range rep.Results {
		if r.Stage == seq.Stable {
			swaps, matched = append(swaps, r.SwapsOut), append(matched, r.Matched)
		}
	}
	return swaps, matched
}

// TestPolicyFileRestart: a job restarted from the file its run saved
// starts STABLE at its second iteration and runs, iteration by iteration,
// the swaps (parameters' included) and recomputes of the run that saved it,
// matching as many tensors.
func TestPolicyFileRestart(t *testing.T) {
	for _, c := range []struct {
		name      string
		scale     int64
		pct       float64
		recompute bool
	}{{testtraces.Small, 1024, 0.8, false}, {testtraces.Small, 1024, 0.85, true}, {"llama16-bf16.jsonl.gz", 4096, 0.7, false}} {
		t.Run(fmt.Sprintf("%s/%v", c.name, c.recompute), func(t *testing.T) {
			if c.name != testtraces.Small && (testing.Short() || policyRace) {
				t.Skip("the public traces are skipped in -short mode and under the race detector")
			}
			tr := testtraces.Read(t, c.name)
			limit := int64(float64(replay.PeakBytes(tr)/c.scale) * c.pct)
			path := filepath.Join(t.TempDir(), "policies.json")
			var opts []chameleon.Option
			if c.recompute {
				var now int64
				opts = append(opts, chameleon.WithClock(func() time.Time { now += 5e3; return time.Unix(0, now) }))
			}
			first := restartRC(t, tr, c.scale, limit, 2, path, c.recompute, opts...)
			require.Equal(t, 1, first.Replans)
			wantSwaps, wantMatched := stable(first)
			require.NotEmpty(t, wantSwaps)
			var persistent int
			var saved struct {
				Policies []struct {
					Tensors []struct {
						ID   int64  `json:"id"`
						Kind string `json:"kind"`
					} `json:"tensors"`
					Swaps []struct {
						Tensor int64 `json:"tensor"`
					} `json:"swaps"`
					Recomputes []json.RawMessage `json:"recomputes"`
				} `json:"policies"`
			}
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal(data, &saved))
			require.Len(t, saved.Policies, 1)
			kind := map[int64]string{}
			for _, x := range saved.Policies[0].Tensors {
				kind[x.ID] = x.Kind
			}
			for _, s := range saved.Policies[0].Swaps {
				if kind[s.Tensor] != "activation" {
					persistent++
				}
			}
			assert.Positive(t, persistent, "swaps of parameters travel")
			if c.recompute {
				assert.NotEmpty(t, saved.Policies[0].Recomputes, "recomputes travel")
			}

			again := restartRC(t, tr, c.scale, limit, 1, path, c.recompute, opts...)
			assert.Equal(t, seq.Warmup.String(), again.Stages[0])
			// The file names the sequence saved last: its policy runs from
			// the first iteration, with no forced eviction.
			require.NotEmpty(t, again.PerIteration)
			first0 := again.PerIteration[0]
			assert.Zero(t, first0.Evictions, "the first iteration runs the saved policy")
			assert.Positive(t, first0.PlannedSwaps+first0.PlannedRecomputes, "the first iteration runs the saved policy")
			for i, s := range again.Stages[1:] {
				assert.Equal(t, seq.Stable.String(), s, "iteration %d", i+1)
			}
			assert.Zero(t, again.Replans)
			assert.Zero(t, again.PolicyUpdates)
			// The same swaps per iteration, tensors matched as before: a
			// tensor whose device address happens to repeat may match once
			// more (the address weighs 0.3 in matching), never less.
			gotSwaps, gotMatched := stable(again)
			n := len(gotSwaps)
			require.Positive(t, n)
			want, wantM := wantSwaps[len(wantSwaps)-n:], wantMatched[len(wantMatched)-n:]
			for i := range gotSwaps {
				assert.GreaterOrEqual(t, gotMatched[i], wantM[i], "tensors matched at STABLE iteration %d", i)
				assert.GreaterOrEqual(t, gotSwaps[i], want[i], "swaps at STABLE iteration %d", i)
				assert.InDelta(t, want[i], gotSwaps[i], 0.02*float64(want[i])+0.5, "swaps at STABLE iteration %d", i)
			}
			assert.Equal(t, want[0], gotSwaps[0], "the first STABLE iteration swaps as the saver's")
			if c.recompute {
				assert.Positive(t, again.Recomputes)
			}
			t.Logf("%s: saved %d swaps (%d of parameters or optimizer state), %d recomputes; saver swaps %v matched %v; restart stages %v, swaps %v, matched %v",
				c.name, len(saved.Policies[0].Swaps), persistent, len(saved.Policies[0].Recomputes), wantSwaps, wantMatched, again.Stages, gotSwaps, gotMatched)
		})
	}
}

func restartRC(t *testing.T, tr *trace.Trace, scale, limit int64, rounds int, path string, recompute bool, opts ...chameleon.Option) *replay.Report {
	t.Helper()
	if !recompute {
		return restart(t, tr, scale, limit, rounds, path, opts...)
	}
	dev, err := host.New(limit)
	require.NoError(t, err)
	t.Cleanup(func() { dev.Close() })
	d := seq.DefaultConfig()
	d.M, d.N = 2, 1
	rep, err := replay.Run(tr, dev, replay.Config{Scale: scale, Rounds: rounds, Limit: limit, PolicyFile: path, Recompute: true,
		Options: append([]chameleon.Option{chameleon.WithDetection(d), chameleon.WithStrictPolicyFile()}, opts...)})
	require.NoError(t, err)
	t.Cleanup(func() { rep.Engine.Close() })
	assert.Zero(t, rep.FailedUses, rep.Failures)
	return rep
}

// TestPolicyFileUpdate: a job restarted from the file at another limit
// starts STABLE at its second iteration through a differential update of
// the saved policy (no warm-up, no profile, no replan), and runs under the
// new limit without evictions.
func TestPolicyFileUpdate(t *testing.T) {
	for _, c := range []struct {
		name     string
		scale    int64
		from, to float64
	}{{testtraces.Small, 1024, 0.8, 0.9}, {testtraces.Small, 1024, 0.8, 0.78}, {"llama16-bf16.jsonl.gz", 4096, 0.7, 0.8}} {
		t.Run(fmt.Sprintf("%s/%.2f-%.2f", c.name, c.from, c.to), func(t *testing.T) {
			if c.name != testtraces.Small && (testing.Short() || policyRace) {
				t.Skip("the public traces are skipped in -short mode and under the race detector")
			}
			tr := testtraces.Read(t, c.name)
			peak := replay.PeakBytes(tr) / c.scale
			path := filepath.Join(t.TempDir(), "policies.json")
			first := restart(t, tr, c.scale, int64(float64(peak)*c.from), 2, path)
			wantSwaps, _ := stable(first)
			again := restart(t, tr, c.scale, int64(float64(peak)*c.to), 1, path)
			assert.Equal(t, seq.Warmup.String(), again.Stages[0])
			for i, s := range again.Stages[1:] {
				assert.Equal(t, seq.Stable.String(), s, "iteration %d", i+1)
			}
			assert.Equal(t, 1, again.PolicyUpdates, "an update")
			assert.Zero(t, again.Replans, "not a replan")
			gotSwaps, _ := stable(again)
			for _, r := range again.Results[1:] {
				assert.Zero(t, r.Evictions, "iteration %d fits the new limit as planned", r.Index)
			}
			if c.to > c.from {
				assert.Less(t, gotSwaps[len(gotSwaps)-1], wantSwaps[len(wantSwaps)-1], "more room lets swaps go")
			} else {
				assert.Greater(t, gotSwaps[len(gotSwaps)-1], wantSwaps[len(wantSwaps)-1], "less room swaps more")
			}
			t.Logf("%s at %.0f%% then %.0f%%: swaps per iteration %v then %v, stages %v, updates %d, replans %d",
				c.name, 100*c.from, 100*c.to, wantSwaps, gotSwaps, again.Stages, again.PolicyUpdates, again.Replans)
		})
	}
}

// FuzzPolicyFile: a policy file is data from disk; loading one returns an
// error and adds nothing, or adds policies that save and load again.
//
// Each input costs two Engines, so the fuzzer's minimization of a new
// interesting input (up to -fuzzminimizetime, 60 s by default, not counted
// in its execs) shows as long runs at 0 execs/s: run it with
// -fuzzminimizetime 2s (about 2,000 execs/s sustained on 2 cores, against
// stalls of 20 s and more with the default). The format alone is fuzzed,
// faster, by internal/policyfile's FuzzDecode.
func FuzzPolicyFile(f *testing.F) {
	f.Add([]byte(`{"format":"chameleon-policies/v1","policies":[{"key":{"hash":1,"ops":4,"bytes":64},` +
		`"swaps":[{"tensor":3,"bytes":16,"out_after_op":0,"freed_at_op":1,"in_issue_op":2,"in_before_op":3}],` +
		`"tensors":[{"ptr":1,"producer":"aten::mm","overload":"default","module":"m","shape":[4]}]}]}`))
	f.Add([]byte(`{"format":"chameleon-policies","version":2,"policies":[{"key":{"hash":1,"ops":4,"bytes":64},` +
		`"assumed":{"limit_bytes":65536,"link":{"d2h_bytes_per_s":5e10,"h2d_bytes_per_s":5e10,"d2h_shared_bytes_per_s":4e10,"h2d_shared_bytes_per_s":4e10},"device":"host"},` +
		`"simulated_ms":1.5,"tensors":[{"id":3,"kind":"activation","bytes":16,"dtype":"f32","shape":[4],"ptr":1,"producer":"aten::mm","overload":"default","module":"m"},` +
		`{"id":9,"kind":"parameter","bytes":512,"dtype":"f32","shape":[128],"ptr":0,"producer":"","overload":"","module":""}],` +
		`"swaps":[{"tensor":3,"bytes":16,"out_after_op":0,"freed_at_op":1,"in_issue_op":2,"in_before_op":3,"issue_out_after_op":0,"issue_in_at_op":2},` +
		`{"tensor":9,"bytes":512,"out_after_op":3,"freed_at_op":4,"in_issue_op":0,"in_before_op":0,"issue_out_after_op":3,"issue_in_at_op":0}],` +
		`"out_order":[0,1],"in_order":[1,0],"recomputes":[{"tensor":3,"bytes":16,"op":0,"dropped_after_op":0,"before_op":2,"kept_inputs":[{"tensor":9,"bytes":512,"from_op":1}],"remade_inputs":null}],` +
		`"profile":{"time_ms":2,"strings":["aten::mm","default","m","f32"],"tensors":[{"id":3,"bytes":16,"kind":0,"dtype":3,"shape":[4],"ptr":1},{"id":9,"bytes":512,"kind":1,"dtype":3,"shape":[128],"ptr":2}],` +
		`"ops":[{"n":0,"o":1,"m":2,"p":1,"in":[9],"out":[3],"mem":528,"flops":0,"io_bytes":0,"rc":true},{"n":0,"o":1,"m":2,"p":1,"in":[],"out":[],"mem":528,"flops":0,"io_bytes":0,"rc":false},` +
		`{"n":0,"o":1,"m":2,"p":2,"in":[],"out":[],"mem":528,"flops":0,"io_bytes":0,"rc":false},{"n":0,"o":1,"m":2,"p":2,"in":[3,9],"out":[],"mem":528,"flops":0,"io_bytes":0,"rc":false}],"live_out":[9]}}]}`))
	f.Add([]byte(`{"format":"chameleon-policies","version":2,"policies":[{"key":{"hash":2,"ops":3,"bytes":16},"assumed":null,"simulated_ms":1,` +
		`"tensors":[{"id":9,"kind":"frozen_parameter","bytes":512,"dtype":"f32","shape":[128],"ptr":0,"producer":"","overload":"","module":""}],` +
		`"swaps":[{"tensor":9,"bytes":512,"out_after_op":0,"freed_at_op":1,"in_issue_op":1,"in_before_op":2,"issue_out_after_op":0,"issue_in_at_op":1}],` +
		`"out_order":[0],"in_order":[0],"recomputes":[],` +
		`"profile":{"time_ms":1,"strings":["aten::mm","","m","f32"],"tensors":[{"id":3,"bytes":16,"kind":0,"dtype":3,"shape":[4],"ptr":1},{"id":9,"bytes":512,"kind":1,"dtype":3,"shape":[128],"ptr":2,"frozen":true}],` +
		`"ops":[{"n":0,"o":1,"m":2,"p":1,"in":[9],"out":[3],"mem":528,"flops":0,"io_bytes":0,"rc":false},{"n":0,"o":1,"m":2,"p":1,"in":[3],"out":[],"mem":528,"flops":0,"io_bytes":0,"rc":false},` +
		`{"n":0,"o":1,"m":2,"p":1,"in":[9,3],"out":[],"mem":528,"flops":0,"io_bytes":0,"rc":false}],"live_out":[9]}}]}`))
	f.Add([]byte(`{"format":"chameleon-policies","version":2,"policies":[]}`))
	f.Add([]byte(`{"format":"other"}`))
	dev, err := host.New(1 << 20)
	if err != nil {
		f.Fatal(err)
	}
	defer dev.Close()
	f.Fuzz(func(t *testing.T, data []byte) {
		eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(64<<10))
		if err != nil {
			t.Fatal(err)
		}
		defer eng.Close()
		if err := eng.LoadPolicies(bytes.NewReader(data), "fuzz"); err != nil {
			if eng.CachedPolicies() != 0 {
				t.Fatalf("a refused file added %d policies: %v", eng.CachedPolicies(), err)
			}
			if !strings.Contains(err.Error(), "policy file fuzz") {
				t.Fatalf("the error does not name the file: %v", err)
			}
			return
		}
		var b bytes.Buffer
		if err := eng.SavePolicies(&b); err != nil {
			t.Fatal(err)
		}
		again, err := chameleon.New(dev, chameleon.WithMemoryLimit(64<<10))
		if err != nil {
			t.Fatal(err)
		}
		defer again.Close()
		if err := again.LoadPolicies(&b, "saved"); err != nil {
			t.Fatalf("a loaded file saved again does not load: %v", err)
		}
		if again.CachedPolicies() != eng.CachedPolicies() {
			t.Fatalf("saved %d policies, loaded %d", eng.CachedPolicies(), again.CachedPolicies())
		}
	})
}

// TestPolicyFileKeepsNoCopyOut: a swap that copies nothing out ("d2h":
// false) survives a load and a save; one without the field stays a copy.
func TestPolicyFileKeepsNoCopyOut(t *testing.T) {
	data := mutate(t, savedRecompute(t), func(m map[string]any) { entry(m, "swaps", 1)["d2h"] = false })
	tr := testtraces.Read(t, testtraces.Small)
	limit := replay.PeakBytes(tr) / 1024 * 85 / 100 // the limit it was planned for: no update
	dev, err := host.New(limit)
	require.NoError(t, err)
	defer dev.Close()
	eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(limit))
	require.NoError(t, err)
	defer eng.Close()
	require.NoError(t, eng.LoadPolicies(bytes.NewReader(data), "d2h.json"))
	var b bytes.Buffer
	require.NoError(t, eng.SavePolicies(&b))
	var saved map[string]any
	require.NoError(t, json.Unmarshal(b.Bytes(), &saved))
	assert.Equal(t, false, entry(saved, "swaps", 1)["d2h"], "kept through load and save")
	_, has := entry(saved, "swaps", 0)["d2h"]
	assert.False(t, has, "a swap with a copy out has no d2h field")
}
