package trace

// Part is a stretch of a training step's ops, First to Last (indices).
type Part struct {
	Name        string
	First, Last int
}

// The parts StepParts names.
const (
	PartForward  = "forward"
	PartBackward = "backward"
	PartAfter    = "after the backward"
)

// StepParts splits a step's ops into its forward (up to the first backward
// op), its backward (from there to the last backward op, with what runs
// between: an optimizer's pieces run in the backward) and what follows it
// (an optimizer step), leaving out a part with no op. It is nil when no op
// is of the backward.
func StepParts(ops []Op) []Part {
	first, last := -1, -1
	for i := range ops {
		if ops[i].Phase == PhaseBackward {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if first < 0 {
		return nil
	}
	var out []Part
	if first > 0 {
		out = append(out, Part{PartForward, 0, first - 1})
	}
	out = append(out, Part{PartBackward, first, last})
	if last < len(ops)-1 {
		out = append(out, Part{PartAfter, last + 1, len(ops) - 1})
	}
	return out
}
