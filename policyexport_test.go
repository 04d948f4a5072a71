package chameleon

import "github.com/chameleon-go/chameleon/internal/policyfile"

// SetPolicySaveStep makes SavePolicyFile write in chunks of chunk bytes and
// call step before each of its steps (policyfile.SaveHooks), for a test that
// interrupts the save; the function returned restores the default.
func SetPolicySaveStep(chunk int, step func(what string) error) (restore func()) {
	old := policySaveHooks
	policySaveHooks = policyfile.SaveHooks{Chunk: chunk, Step: step}
	return func() { policySaveHooks = old }
}
