package layer

import (
	"fmt"
	"slices"
	"strings"

	"github.com/chameleon-go/chameleon/trace"
)

// Cut groups the ops at boundaries given by hand: each of starts (op
// positions in ops) begins a group, and so does every phase change, since a
// group holds one phase. Starts out of range are ignored; 0 and duplicates
// change nothing.
func Cut(ops []trace.Op, starts []int) []Group {
	cut := make([]bool, len(ops))
	for _, s := range starts {
		if s > 0 && s < len(ops) {
			cut[s] = true
		}
	}
	var out []Group
	for i := range ops {
		if i == 0 || cut[i] || ops[i].Phase != ops[i-1].Phase {
			out = append(out, Group{Phase: ops[i].Phase, First: i, Last: i})
			continue
		}
		out[len(out)-1].Last = i
	}
	return out
}

// ModulePattern is a module-path pattern: dot-separated segments, where
// "*" matches any one segment ("model.layers.*").
type ModulePattern []string

// ParseModulePattern reads a module-path pattern.
func ParseModulePattern(s string) (ModulePattern, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("module pattern %q: empty", s)
	}
	p := ModulePattern(strings.Split(strings.TrimSpace(s), "."))
	if slices.Contains(p, "") {
		return nil, fmt.Errorf("module pattern %q: empty segment", s)
	}
	return p, nil
}

// key is the part of module that p matches ("model.layers.3" for
// "model.layers.*" and "model.layers.3.mlp#MmBackward0"), or "".
func (p ModulePattern) key(module string) string {
	module, _, _ = strings.Cut(module, "#")
	seg := strings.Split(module, ".")
	if len(seg) < len(p) {
		return ""
	}
	for i, q := range p {
		if q != "*" && q != seg[i] {
			return ""
		}
	}
	return strings.Join(seg[:len(p)], ".")
}

// ByModule groups the ops by the module p matches: a group starts where the
// matched part of an op's module path changes ("model.layers.3" to
// "model.layers.4"), where ops of a module p does not match begin (the
// embedding, the final norm and head: a group of their own), and at every
// phase change. Ops with no module path (in backward, the gradient
// accumulations) stay in the group they follow.
func ByModule(ops []trace.Op, p ModulePattern) []Group {
	const other = "\x00other"
	var starts []int
	cur := ""
	for i := range ops {
		m := ops[i].Module
		if b, _, _ := strings.Cut(m, "#"); b == "" {
			continue
		}
		k := p.key(m)
		if k == "" {
			k = other
		}
		if k != cur {
			starts = append(starts, i)
			cur = k
		}
	}
	return Cut(ops, starts)
}
