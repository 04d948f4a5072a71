package chameleon

// The package's tests run every plan synchronously (WithSyncPlanning) so
// that a policy applies from the iteration after its profile whatever the
// machine's speed; async_test.go turns it off where planning off the step
// is what is tested.
func init() { syncByDefault = true }
