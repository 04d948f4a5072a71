// Package cli holds what the example commands share on their command
// lines: the usage error (exit status 2), the --limit syntax and the
// median of step times.
package cli

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/chameleon-go/chameleon"
)

// ErrUsage marks a bad command line (exit status 2).
var ErrUsage = errors.New("bad command line")

// Usagef is a bad flag value: an error wrapping ErrUsage.
func Usagef(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, ErrUsage)...)
}

// ParseLimit reads --limit: a share of peak in (0%, 100%], bytes with a
// unit, or none (0: run only without a limit). A bare number is refused
// ("50": did you mean 50%?), so are 0, negative sizes and shares above
// 100%.
func ParseLimit(s string, peak int64) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "none" {
		return 0, nil
	}
	if p, ok := strings.CutSuffix(s, "%"); ok {
		f, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		switch {
		case err != nil || math.IsNaN(f) || math.IsInf(f, 0):
			return 0, Usagef("--limit %q: not a percentage", s)
		case f <= 0:
			return 0, Usagef("--limit %q: a share of the peak must be above 0%% (none runs without a limit)", s)
		case f > 100:
			return 0, Usagef("--limit %q: above 100%% of the peak limits nothing", s)
		}
		return int64(float64(peak) * f / 100), nil
	}
	if strings.HasPrefix(s, "-") {
		return 0, Usagef("--limit %q: a size cannot be negative", s)
	}
	if v, err := strconv.ParseFloat(s, 64); err == nil {
		switch {
		case v == 0:
			return 0, Usagef("--limit %q holds nothing: none runs only without a limit", s)
		case v > 0 && v < 1:
			// A fraction of the peak: 0.5 is 50%.
			return 0, Usagef("--limit %q has no unit: did you mean %s%%, %s of the peak? (bytes need a unit: %sMiB, %sB)", s, strconv.FormatFloat(math.Round(v*1e6)/1e4, 'f', -1, 64), s, s, s)
		case v <= 100:
			return 0, Usagef("--limit %q has no unit: did you mean %s%%? (bytes need a unit: %sMiB, %sB)", s, s, s, s)
		}
		return 0, Usagef("--limit %q has no unit: give a share of the peak (50%%) or bytes with a unit (%sB, 512MiB)", s, s)
	}
	n, err := chameleon.ParseBytes(s)
	if err != nil {
		return 0, Usagef("--limit %q: %v", s, err)
	}
	if n <= 0 {
		return 0, Usagef("--limit %q holds nothing: none runs only without a limit", s)
	}
	return n, nil
}

// Median is the median of ts (sorted in place), NaN when there is none.
func Median(ts []float64) float64 {
	if len(ts) == 0 {
		return math.NaN()
	}
	slices.Sort(ts)
	if len(ts)%2 == 1 {
		return ts[len(ts)/2]
	}
	return (ts[len(ts)/2-1] + ts[len(ts)/2]) / 2
}
