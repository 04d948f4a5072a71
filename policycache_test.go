package chameleon_test

import (
	"bytes"
	"testing"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device/host"
)

// FuzzLoadPolicies: a policy file is data from disk; loading one returns
// an error or adds policies, never panics.
func FuzzLoadPolicies(f *testing.F) {
	f.Add([]byte(`{"format":"chameleon-policies/v1","policies":[{"key":{"hash":1,"ops":4,"bytes":64},` +
		`"swaps":[{"tensor":3,"bytes":16,"out_after_op":0,"freed_at_op":1,"in_issue_op":2,"in_before_op":3}],` +
		`"tensors":[{"ptr":1,"producer":"aten::mm","overload":"default","module":"m","shape":[4]}]}]}`))
	f.Add([]byte(`{"format":"chameleon-policies/v1","policies":[{"key":{"ops":1},"swaps":[{"out_after_op":5,"in_before_op":1}],"tensors":[{}]}]}`))
	f.Add([]byte(`{"format":"other"}`))
	dev, err := host.New(1 << 20)
	if err != nil {
		f.Fatal(err)
	}
	defer dev.Close()
	f.Fuzz(func(t *testing.T, data []byte) {
		eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(64<<10))
		if err != nil {
			t.Fatal(err)
		}
		defer eng.Close()
		if err := eng.LoadPolicies(bytes.NewReader(data), "fuzz"); err != nil && eng.CachedPolicies() != 0 {
			t.Fatalf("a rejected file added %d policies: %v", eng.CachedPolicies(), err)
		}
	})
}
