package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var allCommands = []string{"detect", "matrix", "plan", "profile", "replay"}

func TestEveryCommandIsRegistered(t *testing.T) {
	for _, c := range allCommands {
		assert.Contains(t, commands, c)
	}
	assert.Len(t, commands, len(allCommands), "a new command needs its place in allCommands and docs/json.md")
}

// -h prints the command's usage and exits 0; an unknown flag exits 2 with
// the problem said once; a stray argument is an error (exit 2).
func TestHelpAndBadFlags(t *testing.T) {
	for _, c := range allCommands {
		var out, errb bytes.Buffer
		assert.Equal(t, 0, runMain([]string{c, "-h"}, &out, &errb), c)
		assert.Contains(t, errb.String(), "usage: chameleon "+c, c)
		assert.Contains(t, errb.String(), "-trace", c)

		out.Reset()
		errb.Reset()
		assert.Equal(t, 2, runMain([]string{c, "--bogus"}, &out, &errb), c)
		assert.Equal(t, 1, strings.Count(errb.String(), "flag provided but not defined: -bogus"), "%s: said once:\n%s", c, errb.String())
		assert.Empty(t, out.String())

		errb.Reset()
		args := []string{c, "--trace", bundled, "extra"}
		if c == "matrix" {
			args = []string{c, "--traces", "testdata", "extra"} // the traces it replays are its own
		}
		assert.Equal(t, 2, runMain(args, &out, &errb), c)
		assert.Contains(t, errb.String(), `unexpected argument "extra"`, c)
	}
	var out, errb bytes.Buffer
	assert.Equal(t, 0, runMain([]string{"-h"}, &out, &errb))
	assert.Equal(t, 2, runMain(nil, &out, &errb))
}

// Every flag is checked before any work: a trace that does not exist is
// never reached when a flag is wrong.
func TestFlagsCheckedBeforeWork(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.jsonl.gz")
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"plan", "--trace", missing, "--limit", "90"}, "did you mean 90%?"},
		{[]string{"plan", "--trace", missing, "--limit", "0.9"}, "did you mean 90%, 0.9 of the peak?"},
		{[]string{"plan", "--trace", missing, "--limit", "0.07"}, "did you mean 7%, 0.07 of the peak?"},
		{[]string{"replay", "--trace", missing, "--limit", "80"}, "did you mean 80%?"},
		{[]string{"plan", "--trace", missing, "--limit", "0"}, "no unit"},
		{[]string{"plan", "--trace", missing, "--limit", "0%"}, "above 0%"},
		{[]string{"plan", "--trace", missing, "--limit", "0GiB"}, "0 bytes"},
		{[]string{"replay", "--trace", missing, "--limit", "120%"}, "above 100%"},
		{[]string{"plan", "--trace", missing, "--limit", "-3GiB"}, "negative"},
		{[]string{"plan", "--trace", missing, "--limit", "12884901888"}, "no unit"},
		{[]string{"plan", "--trace", missing}, "--limit: required"},
		{[]string{"plan", "--trace", missing, "--limit", "80%", "--groups", "0"}, "--groups 0"},
		{[]string{"profile", "--trace", missing, "--groups", "0"}, "--groups 0"},
		{[]string{"profile", "--trace", missing, "--iter", "-1"}, "--iter -1"},
		{[]string{"plan", "--trace", missing, "--limit", "80%", "--prefetch", "-1"}, "--prefetch -1"},
		{[]string{"plan", "--trace", missing, "--limit", "80%", "--plot", "mem.jpg"}, `unknown extension ".jpg"`},
		{[]string{"plan", "--trace", missing, "--limit", "80%", "--plot", "mem"}, "no extension"},
		{[]string{"plan", "--trace", missing, "--limit", "80%", "--tiers", "x"}, "--tiers"},
		{[]string{"plan", "--trace", missing, "--limit", "80%", "--page", "3MiB"}, "--page"},
		{[]string{"plan", "--trace", missing, "--limit", "80%", "--grouping", "x"}, "--grouping"},
		{[]string{"plan", "--trace", missing, "--limit", "80%", "--bandwidth", "-1GB/s"}, "--bandwidth"},
		{[]string{"plan", "--trace", missing, "--limit", "80%", "--bandwidth", "55"}, "did you mean 55GB/s (55e9)?"},
		{[]string{"plan", "--trace", missing, "--limit", "80%", "--bandwidth", "400Gb/s"}, "give bytes per second: 50GB/s"},
		{[]string{"detect", "--trace", missing, "--rounds", "0"}, "--rounds 0"},
		{[]string{"replay", "--trace", missing, "--rounds", "0"}, "--rounds 0"},
		{[]string{"replay", "--trace", missing, "--scale", "0"}, "--scale 0"},
		{[]string{"replay", "--trace", missing, "--device", "tpu"}, "--device"},
		{[]string{"replay", "--trace", missing, "--m", "0"}, "m=0"},
		{[]string{"detect"}, "--trace is required"},
		{[]string{"replay"}, "--trace is required"},
	}
	for _, tt := range tests {
		var out, errb bytes.Buffer
		code := runMain(tt.args, &out, &errb)
		assert.Equal(t, 2, code, "%v: %s", tt.args, errb.String())
		assert.Contains(t, errb.String(), tt.want, "%v", tt.args)
		assert.NotContains(t, errb.String(), "missing.jsonl.gz", "%v: the trace was read before the flags were checked", tt.args)
		assert.NotContains(t, errb.String(), "reading", "%v", tt.args)
	}
}

// A Kineto profile passed as --trace, or an Execution Trace without its
// --kineto, gets a hint, not only the decoder's error.
func TestTraceKindHints(t *testing.T) {
	et := "../../trace/pytorch/testdata/llama4-small.et.json.gz"
	kin := "../../trace/pytorch/testdata/llama4-small.kineto.json.gz"
	for _, c := range []string{"detect", "profile", "plan", "replay"} {
		var out, errb bytes.Buffer
		args := []string{c, "--trace", kin}
		if c == "plan" {
			args = append(args, "--limit", "80%")
		}
		assert.Equal(t, 1, runMain(args, &out, &errb), c)
		assert.Contains(t, errb.String(), "looks like a Kineto profile", c)
		assert.Contains(t, errb.String(), "--kineto", c)
		assert.Equal(t, 1, strings.Count(errb.String(), "chameleon "+c+":"), "%s: one error:\n%s", c, errb.String())

		errb.Reset()
		args[2] = et
		assert.Equal(t, 1, runMain(args, &out, &errb), c)
		assert.Contains(t, errb.String(), "looks like a PyTorch Execution Trace", c)
	}
}

// The commands that take one iteration and a group count share their
// defaults.
func TestSameDefaults(t *testing.T) {
	help := func(c string) string {
		var out, errb bytes.Buffer
		require.Equal(t, 0, runMain([]string{c, "-h"}, &out, &errb))
		return errb.String()
	}
	def := func(usage, flag string) string {
		m := regexp.MustCompile(`(?s)\n  -` + flag + `\b[^\n]*\n(?:    [^\n]*\n)*`).FindString(usage)
		require.NotEmpty(t, m, "-%s in\n%s", flag, usage)
		return m
	}
	p, q := help("plan"), help("profile")
	assert.Equal(t, def(p, "iter"), def(q, "iter"))
	assert.Equal(t, def(p, "groups"), def(q, "groups"))
	assert.Contains(t, def(p, "groups"), "(default 32)")
	assert.Contains(t, def(p, "iter"), "(default 1)")
}

// Every command's --json output: one object, the same formatting, the
// schema fields first (schema, command, trace, in that order), the trace
// as given; plan says which files it wrote.
func TestJSONOutputs(t *testing.T) {
	dir := t.TempDir()
	png := filepath.Join(dir, "mem.png")
	runs := map[string][]string{
		"detect":  {"detect", "--trace", bundled, "--json"},
		"profile": {"profile", "--trace", bundled, "--json"},
		"plan":    {"plan", "--trace", bundled, "--limit", "90%", "--json", "--plot", png},
		"replay":  {"replay", "--trace", bundled, "--limit", "90%", "--json", "--quiet"},
	}
	for c, args := range runs {
		var out, errb bytes.Buffer
		require.Equal(t, 0, runMain(args, &out, &errb), "%s: %s", c, errb.String())
		assert.True(t, strings.HasPrefix(out.String(), "{\n  \"schema\": 1,\n  \"command\": \""+c+"\",\n  \"trace\": "), "%s: %.120s", c, out.String())
		var rep map[string]any
		dec := json.NewDecoder(&out)
		require.NoError(t, dec.Decode(&rep), c)
		assert.False(t, dec.More(), c)
		assert.Equal(t, bundled, rep["trace"], c)
		if c == "plan" {
			assert.Contains(t, errb.String(), "wrote "+png)
			st, err := os.Stat(png)
			require.NoError(t, err)
			assert.Positive(t, st.Size())
		}
	}
}

// docs/json.md documents every field of every command's --json output.
func TestJSONFieldsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/json.md")
	require.NoError(t, err)
	text := string(doc)
	common := text[:strings.Index(text, "\n## ")]
	for _, f := range []string{"schema", "command", "trace"} {
		assert.Contains(t, common, "`"+f+"`", "docs/json.md: the common field %s", f)
	}
	for c, v := range map[string]any{"detect": detectReport{}, "profile": profileReport{}, "plan": planReport{}, "replay": replayJSON{}, "matrix": matrixReport{}} {
		section, ok := docSection(text, "## "+c)
		require.True(t, ok, "docs/json.md has no section for %s", c)
		for _, f := range jsonFields(reflect.TypeOf(v), nil) {
			leaf := f[strings.LastIndex(f, ".")+1:]
			if f == "schema" || f == "command" || f == "trace" {
				continue
			}
			assert.Contains(t, section, "`"+leaf+"`", "docs/json.md, %s: field %s", c, f)
		}
	}
}

// docSection is the text of the markdown section headed h, up to the next
// section of its level.
func docSection(text, h string) (string, bool) {
	i := strings.Index(text, "\n"+h+"\n")
	if i < 0 {
		return "", false
	}
	rest := text[i+len(h)+2:]
	if j := strings.Index(rest, "\n## "); j >= 0 {
		rest = rest[:j]
	}
	return rest, true
}

// jsonFields are the JSON names of t's fields and their fields', as
// "name" or "outer.name".
func jsonFields(t reflect.Type, seen map[reflect.Type]bool) []string {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || seen[t] {
		return nil
	}
	if seen == nil {
		seen = map[reflect.Type]bool{}
	}
	seen[t] = true
	defer delete(seen, t)
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && name == "" {
			names = append(names, jsonFields(f.Type, seen)...)
			continue
		}
		if name == "" {
			name = f.Name
		}
		names = append(names, name)
		for _, sub := range jsonFields(f.Type, seen) {
			names = append(names, name+"."+sub)
		}
	}
	return names
}
