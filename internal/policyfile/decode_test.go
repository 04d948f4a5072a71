package policyfile

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/internal/controller"
)

// Seeds of FuzzDecode, also the bases of the table tests: a version 1
// file, a version 2 file with assumptions, a parameter's swap, a recompute
// and a profile, one with a frozen parameter, an empty one, a foreign one.
var (
	seedV1 = []byte(`{"format":"chameleon-policies/v1","policies":[{"key":{"hash":1,"ops":4,"bytes":64},` +
		`"swaps":[{"tensor":3,"bytes":16,"out_after_op":0,"freed_at_op":1,"in_issue_op":2,"in_before_op":3}],` +
		`"tensors":[{"ptr":1,"producer":"aten::mm","overload":"default","module":"m","shape":[4]}]}]}`)
	seedV2 = []byte(`{"format":"chameleon-policies","version":2,"policies":[{"key":{"hash":1,"ops":4,"bytes":64},` +
		`"assumed":{"limit_bytes":65536,"link":{"d2h_bytes_per_s":5e10,"h2d_bytes_per_s":5e10,"d2h_shared_bytes_per_s":4e10,"h2d_shared_bytes_per_s":4e10},"device":"host"},` +
		`"simulated_ms":1.5,"tensors":[{"id":3,"kind":"activation","bytes":16,"dtype":"f32","shape":[4],"ptr":1,"producer":"aten::mm","overload":"default","module":"m"},` +
		`{"id":9,"kind":"parameter","bytes":512,"dtype":"f32","shape":[128],"ptr":0,"producer":"","overload":"","module":""}],` +
		`"swaps":[{"tensor":3,"bytes":16,"out_after_op":0,"freed_at_op":1,"in_issue_op":2,"in_before_op":3,"issue_out_after_op":0,"issue_in_at_op":2},` +
		`{"tensor":9,"bytes":512,"out_after_op":3,"freed_at_op":4,"in_issue_op":0,"in_before_op":0,"issue_out_after_op":3,"issue_in_at_op":0}],` +
		`"out_order":[0,1],"in_order":[1,0],"recomputes":[{"tensor":3,"bytes":16,"op":0,"dropped_after_op":0,"before_op":2,"kept_inputs":[{"tensor":9,"bytes":512,"from_op":1}],"remade_inputs":null}],` +
		`"profile":{"time_ms":2,"strings":["aten::mm","default","m","f32"],"tensors":[{"id":3,"bytes":16,"kind":0,"dtype":3,"shape":[4],"ptr":1},{"id":9,"bytes":512,"kind":1,"dtype":3,"shape":[128],"ptr":2}],` +
		`"ops":[{"n":0,"o":1,"m":2,"p":1,"in":[9],"out":[3],"mem":528,"flops":0,"io_bytes":0,"rc":true},{"n":0,"o":1,"m":2,"p":1,"in":[],"out":[],"mem":528,"flops":0,"io_bytes":0,"rc":false},` +
		`{"n":0,"o":1,"m":2,"p":2,"in":[],"out":[],"mem":528,"flops":0,"io_bytes":0,"rc":false},{"n":0,"o":1,"m":2,"p":2,"in":[3,9],"out":[],"mem":528,"flops":0,"io_bytes":0,"rc":false}],"live_out":[9]}}]}`)
	seedFrozen = []byte(`{"format":"chameleon-policies","version":2,"policies":[{"key":{"hash":2,"ops":3,"bytes":16},"assumed":null,"simulated_ms":1,` +
		`"tensors":[{"id":9,"kind":"frozen_parameter","bytes":512,"dtype":"f32","shape":[128],"ptr":0,"producer":"","overload":"","module":""}],` +
		`"swaps":[{"tensor":9,"bytes":512,"out_after_op":0,"freed_at_op":1,"in_issue_op":1,"in_before_op":2,"issue_out_after_op":0,"issue_in_at_op":1}],` +
		`"out_order":[0],"in_order":[0],"recomputes":[],` +
		`"profile":{"time_ms":1,"strings":["aten::mm","","m","f32"],"tensors":[{"id":3,"bytes":16,"kind":0,"dtype":3,"shape":[4],"ptr":1},{"id":9,"bytes":512,"kind":1,"dtype":3,"shape":[128],"ptr":2,"frozen":true}],` +
		`"ops":[{"n":0,"o":1,"m":2,"p":1,"in":[9],"out":[3],"mem":528,"flops":0,"io_bytes":0,"rc":false},{"n":0,"o":1,"m":2,"p":1,"in":[3],"out":[],"mem":528,"flops":0,"io_bytes":0,"rc":false},` +
		`{"n":0,"o":1,"m":2,"p":1,"in":[9,3],"out":[],"mem":528,"flops":0,"io_bytes":0,"rc":false}],"live_out":[9]}}]}`)
	// seedWriteBack is seedV2 with the parameter's copy out written back
	// after op 1 (simulate.Swap.Early).
	seedWriteBack = bytes.Replace(seedV2, []byte(`"in_before_op":0,"issue_out_after_op":3`),
		[]byte(`"in_before_op":0,"copy_out_after_op":1,"issue_out_after_op":2`), 1)
	seedEmpty   = []byte(`{"format":"chameleon-policies","version":2,"policies":[]}`)
	seedForeign = []byte(`{"format":"other"}`)
)

// fuzzConfig is the device of the root package's FuzzPolicyFile: 64 KiB.
var fuzzConfig = Config{MaxTensor: 64 << 10}

// FuzzDecode: a policy file is data from disk. Decode returns an error
// and the zero File, or a File that encodes to a file Decode reads back
// to the same encoding.
func FuzzDecode(f *testing.F) {
	for _, s := range [][]byte{seedV1, seedV2, seedFrozen, seedWriteBack, seedEmpty, seedForeign} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fc, err := Decode(data, fuzzConfig)
		if err != nil {
			if !reflect.DeepEqual(fc, File{}) {
				t.Fatalf("a refused file gave %+v: %v", fc, err)
			}
			if err.Error() == "" {
				t.Fatal("an error with no message")
			}
			return
		}
		v1 := fc.Format != FormatName
		for i := range fc.Policies {
			if fc.Policies[i].Ordered() == v1 {
				t.Fatalf("policy %d: ordered %v in a file of format %q", i, fc.Policies[i].Ordered(), fc.Format)
			}
		}
		enc, err := Encode(fc)
		if err != nil {
			t.Fatal(err)
		}
		again, err := Decode(enc, fuzzConfig)
		if err != nil {
			t.Fatalf("a decoded file encoded again does not decode: %v\n%s", err, enc)
		}
		if len(again.Policies) != len(fc.Policies) {
			t.Fatalf("encoded %d policies, decoded %d", len(fc.Policies), len(again.Policies))
		}
		enc2, err := Encode(again)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(enc, enc2) {
			t.Fatalf("the encoding changed through a decode:\n%s\n%s", enc, enc2)
		}
	})
}

// edit applies f to the JSON of a file.
func edit(t *testing.T, data []byte, f func(m map[string]any)) []byte {
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

func first(m map[string]any) map[string]any { return m["policies"].([]any)[0].(map[string]any) }

func item(m map[string]any, keys ...any) map[string]any {
	var v any = m
	for _, k := range keys {
		switch k := k.(type) {
		case string:
			v = v.(map[string]any)[k]
		case int:
			v = v.([]any)[k]
		}
	}
	return v.(map[string]any)
}

// TestDecodeRefuses: every field out of its range, a reference to nothing,
// a foreign, newer or damaged file: refused with the field's path (or the
// JSON's line) and what is wrong, exactly.
func TestDecodeRefuses(t *testing.T) {
	_, err := Decode(seedV2, Config{})
	require.NoError(t, err)
	set := func(v any, keys ...any) func(m map[string]any) {
		return func(m map[string]any) {
			field := keys[len(keys)-1].(string)
			item(first(m), keys[:len(keys)-1]...)[field] = v
		}
	}
	cases := []struct {
		name string
		f    func(m map[string]any)
		raw  []byte
		cfg  Config
		want string
	}{
		{name: "unknown tensor", f: set(77, "swaps", 1, "tensor"), want: "policies[0].swaps[1].tensor: 77: not among the policy's tensors"},
		{name: "negative swap bytes", f: set(-1, "swaps", 0, "bytes"), want: "policies[0].swaps[0].bytes: -1: negative"},
		{name: "swap above its tensor", f: set(1024, "swaps", 0, "bytes"), want: "policies[0].swaps[0].bytes: 1024: more than its tensor's 16 bytes, rounded up to 512"},
		{name: "tensor above 4 TiB", f: set(int64(5)<<40, "tensors", 1, "bytes"), want: "policies[0].tensors[1].bytes: 5497558138880 bytes: larger than 4 TiB (4398046511104 bytes)"},
		{name: "tensor above the device", f: set(1<<20, "tensors", 1, "bytes"), cfg: fuzzConfig,
			want: "policies[0].tensors[1].bytes: 1048576 bytes: larger than the device (65536 bytes)"},
		{name: "tensor of no bytes", f: set(0, "tensors", 0, "bytes"), want: "policies[0].tensors[0].bytes: 0: want at least 1"},
		{name: "tensor kind", f: set("weight", "tensors", 1, "kind"),
			want: `policies[0].tensors[1].kind: "weight": want "activation", "parameter", "optimizer_state" or "frozen_parameter"`},
		{name: "negative dimension", f: set([]int{-4}, "tensors", 0, "shape"), want: "policies[0].tensors[0].shape[0]: -4: want 0 to 281474976710656"},
		{name: "tensor twice", f: set(3, "tensors", 1, "id"), want: "policies[0].tensors[1].id: 3: listed twice"},
		{name: "long name", f: set(strings.Repeat("x", MaxNameLen+1), "tensors", 0, "module"), want: "policies[0].tensors[0].module: 4097 bytes: at most 4096"},
		{name: "negative byte key", f: set(-64, "key", "bytes"), want: "policies[0].key.bytes: -64: want 0 to 1152921504606846976"},
		{name: "ops in the millions", f: set(50_000_000, "key", "ops"), want: "policies[0].key.ops: 50000000: want 1 to 4194304"},
		{name: "swap order", f: func(m map[string]any) { first(m)["out_order"] = []int{0, 0} },
			want: "policies[0].out_order[1]: 0: want each swap index 0 to 1 once"},
		{name: "swap order length", f: func(m map[string]any) { first(m)["in_order"] = []int{0} }, want: "policies[0].in_order: 1 entries for 2 swaps"},
		{name: "issue out of its gap", f: set(-3, "swaps", 0, "issue_in_at_op"), want: "policies[0].swaps[0].issue_in_at_op: -3: want 2 to 3"},
		{name: "write-back at its out", f: set(3, "swaps", 1, "copy_out_after_op"),
			want: "policies[0].swaps[1]: tensor 9: write-back after op 3 for out 3 use 0 (no copy out: false): want it before out, or after use when the swap does not wrap: invalid simulation input"},
		{name: "issue before its write", f: func(m map[string]any) {
			s := first(m)["swaps"].([]any)[1].(map[string]any)
			s["copy_out_after_op"], s["issue_out_after_op"] = 2, 1
		}, want: "policies[0].swaps[1].issue_out_after_op: 1: want 2 to 3"},
		{name: "activation expected", f: set(9, "recomputes", 0, "tensor"), want: "policies[0].recomputes[0].tensor: 9: a parameter where an activation is needed"},
		{name: "kept input", f: set(5, "recomputes", 0, "kept_inputs", 0, "tensor"), want: "policies[0].recomputes[0].kept_inputs[0].tensor: 5: not a tensor of the profile"},
		{name: "limit", f: set(0, "assumed", "limit_bytes"), want: "policies[0].assumed.limit_bytes: 0: want 1 to 281474976710656"},
		{name: "link", f: set(-1, "assumed", "link", "d2h_bytes_per_s"), want: "policies[0].assumed.link.d2h_bytes_per_s: -1: want a rate above 0 and at most 1e+13"},
		{name: "simulated step", f: set(-2, "simulated_ms"), want: "policies[0].simulated_ms: -2: want 0 to 1e+09"},
		{name: "profile op name", f: set(99, "profile", "ops", 3, "n"), want: "policies[0].profile.ops[3].n: 99: want a string index 0 to 3"},
		{name: "profile op tensor", f: set([]int{44}, "profile", "ops", 2, "in"), want: "policies[0].profile.ops[2].in[0]: 44: not among the profile's tensors"},
		{name: "profile phase", f: set(9, "profile", "ops", 0, "p"), want: "policies[0].profile.ops[0].p: 9: want 0 to 3"},
		{name: "profile ops", f: func(m map[string]any) { p := item(first(m), "profile"); p["ops"] = p["ops"].([]any)[1:] },
			want: "policies[0].profile.ops: 3 ops: the key says 4"},
		{name: "profile live out", f: set([]int{-1}, "profile", "live_out"), want: "policies[0].profile.live_out[0]: -1: not among the profile's tensors"},
		{name: "profile frozen activation", f: set(true, "profile", "tensors", 0, "frozen"),
			want: "policies[0].profile.tensors[0].frozen: true on a tensor of kind 0: only a parameter (1) is frozen"},
		{name: "policy tensor not profiled", f: func(m map[string]any) {
			p := item(first(m), "profile")
			p["tensors"].([]any)[0].(map[string]any)["id"] = 4
			p["ops"].([]any)[0].(map[string]any)["out"] = []int{4}
			p["ops"].([]any)[3].(map[string]any)["in"] = []int{4, 9}
		}, want: "policies[0].tensors[0].id: 3: not a tensor of the profile"},
		{name: "last unknown", f: func(m map[string]any) { m["last"] = map[string]any{"hash": 5, "ops": 4, "bytes": 64} },
			want: "last: no policy of the file has this key"},
		{name: "unknown field", f: set(1, "colour"), want: `json: unknown field "colour"`},
		{name: "wrong type", f: set("many", "swaps", 0, "bytes"), want: "field policies.swaps.bytes: string, want an integer"},
		{name: "wrong type, the file's own", f: func(m map[string]any) { item(first(m), "profile")["ops"].([]any)[1] = 5 },
			want: "field policies.profile.ops: number, want an object"},
		{name: "wrong type, a list of the file's", f: set(5, "swaps"), want: "field policies.swaps: number, want a list"},
		{name: "wrong type, pointer", f: set(5, "assumed"), want: "field policies.assumed: number, want an object"},
		{name: "newer version", f: func(m map[string]any) { m["version"] = 3 }, want: "version: 3: this build reads versions 1 and 2"},
		{name: "no version", f: func(m map[string]any) { delete(m, "version") }, want: "version: missing"},
		{name: "foreign file", raw: seedForeign, want: `format: "other": not a policy file (want "chameleon-policies")`},
		{name: "no format", raw: []byte(`{"policies":[]}`), want: "format: missing: not a policy file"},
		{name: "not JSON", raw: []byte("\x1f\x8b\x08 gzip?"), want: "line 1: invalid character '\\x1f' looking for beginning of value"},
		{name: "top level", raw: []byte(`{"format":"chameleon-policies","version":2,"policies":{}}`),
			want: "line 1: field policies: object, want a list"},
		{name: "empty", raw: []byte{}, want: "truncated: EOF"},
		{name: "trailing garbage", raw: append(bytes.Clone(seedEmpty), "\n{}"...), want: "line 2: trailing data after the policy file's object"},
		{name: "cut short", raw: seedV2[:len(seedV2)/2], want: "truncated: unexpected EOF"},
		{name: "v1 lists", raw: bytes.Replace(seedV1, []byte(`"tensors":[{"ptr":1,"producer":"aten::mm","overload":"default","module":"m","shape":[4]}]`), []byte(`"tensors":[]`), 1),
			want: "policies[0].tensors: 0 entries for 1 swaps"},
		{name: "v1 swap", raw: bytes.Replace(seedV1, []byte(`"in_issue_op":2`), []byte(`"in_issue_op":9`), 1),
			want: "policies[0].swaps[0]: "},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			data := c.raw
			if c.f != nil {
				data = edit(t, seedV2, c.f)
			}
			fc, err := Decode(data, c.cfg)
			require.Error(t, err)
			assert.Zero(t, fc, "a refused file gives no policy")
			if strings.HasSuffix(c.want, ": ") {
				assert.True(t, strings.HasPrefix(err.Error(), c.want), "%v", err)
			} else {
				assert.Contains(t, err.Error(), c.want)
				assert.True(t, strings.HasSuffix(err.Error(), c.want), "%v", err)
			}
		})
	}
}

// TestDecodeV1: a file of version 1 comes back as version 2 policies of
// activations, their swaps issued at their own ops, with no ordinals.
func TestDecodeV1(t *testing.T) {
	fc, err := Decode(seedV1, Config{})
	require.NoError(t, err)
	want := []Policy{{
		Key:      controller.Key{Hash: 1, Ops: 4, Bytes: 64},
		Tensors:  []Tensor{{ID: 3, Kind: KindActivation, Bytes: 16, Shape: []int64{4}, Ptr: 1, Producer: "aten::mm", Overload: "default", Module: "m"}},
		Swaps:    []Swap{{Tensor: 3, Bytes: 16, Out: 0, Free: 1, In: 2, Use: 3, IssueOut: 0, IssueIn: 2}},
		OutOrder: []int{0}, InOrder: []int{0},
	}}
	assert.Equal(t, File{Policies: want}, fc)
	assert.False(t, fc.Policies[0].Ordered())

	fc, err = Decode(seedV2, Config{})
	require.NoError(t, err)
	assert.True(t, fc.Policies[0].Ordered())
	assert.Equal(t, FormatName, fc.Format)
	assert.Equal(t, Version, fc.Version)
}

// TestEncode: a file is its JSON and a newline, of this format and
// version whatever the File says; no policies are written as [].
func TestEncode(t *testing.T) {
	data, err := Encode(File{Format: "x", Version: 7})
	require.NoError(t, err)
	assert.Equal(t, string(seedEmpty)+"\n", string(data))

	fc, err := Decode(seedFrozen, Config{})
	require.NoError(t, err)
	data, err = Encode(fc)
	require.NoError(t, err)
	written := bytes.Replace(seedFrozen, []byte(`"module":""}`), []byte(`"module":"","ord":0}`), 1)
	assert.Equal(t, string(written)+"\n", string(data), "a file is written again byte for byte, with its tensors' ordinals")

	last := fc.Policies[0].Key
	fc.Last = &last
	data, err = Encode(fc)
	require.NoError(t, err)
	again, err := Decode(data, Config{})
	require.NoError(t, err)
	assert.Equal(t, fc, again)
}

// TestRecomputeSim: a recompute of the file is the simulator's, kept and
// remade inputs included.
func TestRecomputeSim(t *testing.T) {
	r := Recompute{Tensor: 3, Bytes: 16, Op: 1, Drop: 2, Before: 5,
		Kept: []Kept{{Tensor: 9, Bytes: 512, From: 0}}, Remade: []Remade{{Tensor: 4, Bytes: 8, Op: 0}}}
	s := r.Sim()
	assert.Equal(t, r.Tensor, s.Tensor)
	assert.Equal(t, []int{1, 2, 5}, []int{s.Op, s.Drop, s.Before})
	require.Len(t, s.Kept, 1)
	assert.Equal(t, 9, int(s.Kept[0].Tensor))
	assert.Equal(t, int64(512), s.Kept[0].Bytes)
	require.Len(t, s.Remade, 1)
	assert.Equal(t, 4, int(s.Remade[0].Tensor))
	assert.Nil(t, Recompute{}.Sim().Kept)
}

// TestDecodeWriteBack: a swap's write-back op (copy_out_after_op) comes
// back as the simulator's Early swap and is written again as it was.
func TestDecodeWriteBack(t *testing.T) {
	fc, err := Decode(seedWriteBack, Config{})
	require.NoError(t, err)
	s := fc.Policies[0].Swaps[1]
	require.NotNil(t, s.CopyAfter)
	sw := s.Sim()
	assert.True(t, sw.Early)
	assert.Equal(t, 1, sw.CopyAfter)
	assert.False(t, fc.Policies[0].Swaps[0].Sim().Early)
	out, err := Encode(fc)
	require.NoError(t, err)
	assert.Contains(t, string(out), `"copy_out_after_op":1`)
	back, err := Decode(out, Config{})
	require.NoError(t, err)
	assert.Equal(t, fc, back)
}
