package main

import (
	"bytes"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
)

// The embedding example runs: it swaps (its activations are more than the
// limit), plans a policy, runs STABLE steps under it and reads back every
// byte it wrote (run fails otherwise). The plan is waited for, so that the
// STABLE steps run under it however loaded the machine is (the program
// itself plans off the step, and on a busy machine its few steps may end
// before the plan lands).
func TestEmbed(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(&out, 12, chameleon.WithSyncPlanning(true)))
	s := out.String()
	assert.Contains(t, s, "STABLE")
	assert.Contains(t, s, "every byte read back intact")
	m := regexp.MustCompile(`peak (\d+) KiB`).FindStringSubmatch(s)
	require.NotNil(t, m, s)
	peak, _ := strconv.Atoi(m[1])
	assert.LessOrEqual(t, peak, limit>>10, "within the limit")
	assert.Regexp(t, `swapped [1-9]\d* KiB out`, s)
	assert.Regexp(t, `[1-9]\d* policies planned`, s)
	assert.Regexp(t, `STABLE +planned swaps out [1-9]`, s, "the policy's swaps run")
}

// The README shows this program as it is, whole: it builds as pasted.
func TestREADMEShowsIt(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	src, err := os.ReadFile("main.go")
	require.NoError(t, err)
	body := string(src[bytes.Index(src, []byte("package main")):])
	assert.Contains(t, string(readme), "```go\n"+strings.TrimSpace(body)+"\n```", "README.md's embedding program differs from examples/embed/main.go")
	assert.Contains(t, string(readme), "go install ./cmd/chameleon")
}
