package workers

import "testing"

func TestHostBoundIsDecidedByTheInstancesOwnSubject(t *testing.T) {
	hive := Spec{Name: "rt", Instance: "hive-1", Subjects: []string{"steward.events.credential.rotated.hive-1"}}
	if !hostBound(hive) {
		t.Error("a Spec reading its own hive's subject is not host-bound")
	}
	join := Spec{Name: "join", Instance: "box-7", Subjects: []string{
		"steward.events.invitation.written.box-7", "steward.events.hostfloor.published"}}
	if !hostBound(join) {
		t.Error("join, reading its box's invitations and the shared floor, is not host-bound")
	}
	converge := Spec{Name: "converge", Instance: "prod", Subjects: []string{"steward.events.release.published"}}
	if hostBound(converge) {
		t.Error("converge, reading the shared release subject, is host-bound")
	}
	every := Spec{Name: "rt", Instance: "all", Subjects: []string{"steward.events.credential.rotated.>"}}
	if hostBound(every) {
		t.Error("a Spec reading every hive is host-bound")
	}
}
