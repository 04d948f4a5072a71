package main

import (
	"bytes"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestVersion(t *testing.T) {
	var out, errb bytes.Buffer
	code := runMain([]string{"version"}, &out, &errb)
	assert.Zero(t, code, errb.String())
	assert.Contains(t, out.String(), "chameleon ")
	assert.Contains(t, out.String(), runtime.Version())
}
