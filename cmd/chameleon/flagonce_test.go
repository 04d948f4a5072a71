package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A flag given twice is refused before any work, naming both values, in
// every form the flag package reads (-f v, --f=v, a bool flag).
func TestRepeatedFlagRefused(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.svg"), filepath.Join(dir, "b.svg")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"plan", "--trace", bundled, "--limit", "80%", "--plot", a, "--plot", b}, "--plot given twice (--plot " + a + ", then --plot " + b + ")"},
		{[]string{"plan", "--trace", bundled, "--limit", "80%", "--perfetto=" + a, "-perfetto", b}, "--perfetto given twice"},
		{[]string{"plan", "--trace", bundled, "--limit", "80%", "--limit=70%"}, "--limit given twice (--limit 80%, then --limit=70%)"},
		{[]string{"plan", "--trace", bundled, "--limit", "80%", "--recompute=false", "--recompute"}, "--recompute given twice"},
		{[]string{"replay", "--trace", bundled, "--scale", "8", "--scale", "16"}, "--scale given twice"},
		{[]string{"detect", "--trace", bundled, "--json", "--json"}, "--json given twice"},
	} {
		var out, errb bytes.Buffer
		assert.Equal(t, 2, runMain(c.args, &out, &errb), "%v", c.args)
		assert.Contains(t, errb.String(), c.want, "%v", c.args)
		assert.NotContains(t, errb.String(), "reading ", "refused before the trace is read: %v", c.args)
	}
	// Once each is fine, and a flag's value may look like another flag's name.
	var out, errb bytes.Buffer
	require.Equal(t, 0, runMain([]string{"detect", "--trace", bundled, "--json"}, &out, &errb), errb.String())
}

// replay -h gives --scale one default, which --timing changes.
func TestReplayScaleHelp(t *testing.T) {
	var out, errb bytes.Buffer
	require.Equal(t, 0, runMain([]string{"replay", "-h"}, &out, &errb))
	help := errb.String()
	i := strings.Index(help, "\n  -scale")
	require.GreaterOrEqual(t, i, 0, help)
	entry := help[i+1:]
	if j := strings.Index(entry[1:], "\n  -"); j >= 0 {
		entry = entry[:j+1]
	}
	assert.Equal(t, 1, strings.Count(entry, "default"), entry)
	assert.Contains(t, entry, "default 1024; 1 with --timing")
}
