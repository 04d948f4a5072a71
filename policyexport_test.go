package chameleon

// SetPolicySaveStep makes SavePolicyFile write in chunks of chunk bytes and
// call step before each of its steps (saveHooks), for a test that
// interrupts the save; the function returned restores the default.
func SetPolicySaveStep(chunk int, step func(what string) error) (restore func()) {
	old := policySaveHooks
	policySaveHooks = saveHooks{chunk: chunk, step: step}
	return func() { policySaveHooks = old }
}
