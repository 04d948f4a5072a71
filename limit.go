package chameleon

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

var byteUnits = []struct {
	suffix string
	mult   float64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1},
}

// ParseBytes reads a byte count as people write one: "12884901888",
// "12e9", "512KiB", "12GiB", "1.5GB" (binary units for KiB/MiB/GiB and the
// bare K/M/G, decimal for KB/MB/GB).
func ParseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := 1.0
	for _, u := range byteUnits {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = strings.TrimSpace(v), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return toBytes(v*mult, s)
}

// toBytes converts a byte count, refusing what int64 cannot hold.
func toBytes(v float64, s string) (int64, error) {
	if v >= math.MaxInt64 {
		return 0, fmt.Errorf("size %q too large", s)
	}
	return int64(v), nil
}

// ParseLimit reads a memory limit: a byte count (ParseBytes) or a
// percentage of peak ("70%").
func ParseLimit(s string, peak int64) (int64, error) {
	s = strings.TrimSpace(s)
	if p, ok := strings.CutSuffix(s, "%"); ok {
		v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || !(v > 0) || math.IsInf(v, 0) {
			return 0, fmt.Errorf("bad percentage %q", s)
		}
		return toBytes(float64(peak)*v/100, s)
	}
	return ParseBytes(s)
}

// ParseTiers reads the limit tiers of WithTiers as people write them:
// whole percentages, increasing, separated by commas ("90,95,100",
// "90%, 100%", "100").
func ParseTiers(s string) ([]int, error) {
	var out []int
	for t := range strings.SplitSeq(s, ",") {
		t = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(t), "%"))
		v, err := strconv.Atoi(t)
		if err != nil || v < 1 || v > 100 {
			return nil, fmt.Errorf("tier %q: want a whole percentage in [1, 100]", t)
		}
		if len(out) > 0 && v <= out[len(out)-1] {
			return nil, fmt.Errorf("tiers %q: want increasing percentages", s)
		}
		out = append(out, v)
	}
	return out, nil
}
