//go:build !race

package pytorch

const raceEnabled = false
