package main

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// planDocRows reads the tables of docs/plan.md: per table (by its header's
// third column), "trace@limit" to the row's cells.
func planDocRows(t *testing.T) map[string]map[string][]string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/plan.md")
	require.NoError(t, err)
	tables := map[string]map[string][]string{}
	var cur map[string][]string
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "|---") {
			continue
		}
		if !strings.HasPrefix(line, "| ") {
			cur = nil
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		switch {
		case cells[0] == "trace" && len(cells) > 2:
			cur = map[string][]string{}
			tables[cells[2]] = cur
		case cur != nil && len(cells) > 2:
			cur[strings.TrimSuffix(cells[0], ".jsonl.gz")+"@"+cells[1]] = cells
		}
	}
	return tables
}

// TestREADMEPlanFigures: the plan figures the README states are those of
// docs/plan.md, which CI's long step checks against what the head plans
// (TestPlanTraces): a figure that drifts fails here or there.
func TestREADMEPlanFigures(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	text := strings.Join(strings.Fields(string(readme)), " ")
	tables := planDocRows(t)
	swapsAlone, hybrid := tables["planned for"], tables["swaps alone"]
	require.NotEmpty(t, swapsAlone, "docs/plan.md: the swaps-alone table")
	require.NotEmpty(t, hybrid, "docs/plan.md: the swap-and-recompute table")
	cell := func(table map[string][]string, row string, col int) string {
		r := table[row]
		require.Greater(t, len(r), col, "docs/plan.md has no row %s", row)
		// "17.4% (90%)" and "17.4% (90%), does not fit": the figure.
		return strings.Fields(r[col])[0]
	}
	pct := func(s string) string { // 222.6% -> 222% as the README rounds it
		var f float64
		_, err := fmt.Sscanf(s, "%f%%", &f)
		require.NoError(t, err, s)
		return fmt.Sprintf("%.0f%%", f)
	}
	for _, c := range []struct{ pattern, want string }{
		{`llama16-bf16 costs (\S+) at 45% of its peak`, cell(hybrid, "llama16-bf16@45%", 8)},
		{`; (\S+) for the byte count alone`, cell(hybrid, "llama16-bf16@45%", 3)},
		{`the rest\), (\S+) at 80%;`, cell(hybrid, "llama16-bf16@80%", 8)},
		{`llama16-lora (\S+) at 45%;`, cell(hybrid, "llama16-lora@45%", 8)},
		{`llama7b-8l at 60% (\S+), its layout fitting`, cell(hybrid, "llama7b-8l-bf16@60%", 8)},
		{`\(llama16-bf16 at 80%: (\S+), bound`, cell(swapsAlone, "llama16-bf16@80%", 4)},
		{`at 80%: \S+, bound (\S+);`, cell(swapsAlone, "llama16-bf16@80%", 5)},
		{`; swap-all (\S+)\)`, pct(cell(swapsAlone, "llama16-bf16@80%", 6))},
	} {
		m := regexp.MustCompile(c.pattern).FindStringSubmatch(text)
		require.NotNil(t, m, "README.md no longer says %q", c.pattern)
		require.Equal(t, c.want, m[1], "README.md %q: docs/plan.md says %s", c.pattern, c.want)
	}
}
