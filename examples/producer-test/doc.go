// Module producer-test is what a team using jetbridge writes: a small
// producer service (package orders) and a small webhook receiver (package
// notify), each tested against real JetStream and the real bridge with
// github.com/sotercare/jetbridge/jetbridgetest. It depends on jetbridge
// only through its public packages.
package producertest
