package plan

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/trace"
)

// Boundaries groups at layer boundaries given by hand (layer.Cut): each of
// seqs, an op's Seq number in the iteration, starts a group, and so does
// every phase change. A seq the iteration does not have is ignored, so one
// set of boundaries serves iterations of different lengths.
func Boundaries(seqs ...int) Grouper {
	return GrouperFunc(func(ops []trace.Op) []layer.Group {
		at := make(map[int]int, len(ops))
		for i := range ops {
			at[ops[i].Seq] = i
		}
		starts := make([]int, 0, len(seqs))
		for _, s := range seqs {
			if i, ok := at[s]; ok {
				starts = append(starts, i)
			}
		}
		return layer.Cut(ops, starts)
	})
}

// ModuleBoundaries groups by module path (layer.ByModule): a group starts
// where the part of the op's module that pattern matches changes, so
// "model.layers.*" makes one group per transformer layer, the ops outside
// the layers groups of their own.
func ModuleBoundaries(pattern string) (Grouper, error) {
	p, err := layer.ParseModulePattern(pattern)
	if err != nil {
		return nil, err
	}
	return GrouperFunc(func(ops []trace.Op) []layer.Group { return layer.ByModule(ops, p) }), nil
}

// ParseBoundaries reads layer boundaries given by hand: a comma-separated
// list of op seq numbers ("120,240,360", Boundaries) or a module-path
// pattern ("model.layers.*", ModuleBoundaries).
func ParseBoundaries(s string) (Grouper, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, fmt.Errorf("boundaries: empty")
	}
	if s[0] < '0' || s[0] > '9' {
		g, err := ModuleBoundaries(s)
		if err != nil {
			return nil, fmt.Errorf("boundaries: %w", err)
		}
		return g, nil
	}
	var seqs []int
	for i, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 0 {
			return nil, fmt.Errorf("boundaries: item %d, %q: want an op seq number (0 or more) or a module pattern", i+1, f)
		}
		seqs = append(seqs, v)
	}
	return Boundaries(seqs...), nil
}
