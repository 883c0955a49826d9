//! Which changes one transaction of the writer takes, and the locks it begins with.

use std::collections::{BTreeSet, VecDeque};

use super::super::super::shares::Held;
use super::super::tx::Turn;
use super::super::{RAISE_LOCK, RAISED_ALONGSIDE};
use super::{Job, principal_key, principal_lock};

/// The changes one transaction takes from the front of the queue, in groups that run one after another: the
/// changes of a group have their statements pipelined together.
///
/// A transaction of changes that hold the raising lock shared at most (those of [`Turn::Alongside`] and
/// [`Turn::RaisingAlongside`]) takes every such change at the front of the queue:
/// first one group of raises, those that may be pipelined together (see [`Turn::RaisingAlongside`]; a raise
/// that may not waits, in its place, for a later transaction), then those run alongside, in the order they
/// came, in groups (one that holds principals' locks in a group of its own). The raises go first because a
/// raise tells its caller nothing before it is kept, where a call's start tells its caller what it decided
/// as soon as it has (see `start_call`): a raise that fails leaves the changes after it unrun, and rolls back
/// none that told its caller already. Any order of the changes is one they could have come in: the writer
/// reads the queue again only once it has applied all it read, so none of them was queued after another ran.
/// A transaction of changes of the other turns ([`Turn::RaisingAlone`], [`Turn::Apart`]) takes those of the
/// front's turn at the front of the queue, each in a group of its own.
pub(super) struct Plan {
    pub(super) turn: Turn,
    pub(super) groups: Vec<Vec<Job>>,
}

impl Plan {
    /// The plan of the next transaction, taken from the front of `batch`; `None` when it is empty.
    pub(super) fn take(batch: &mut VecDeque<Job>) -> Option<Plan> {
        let turn = batch.front()?.turn;
        if matches!(turn, Turn::RaisingAlone | Turn::Apart) {
            let mut groups = Vec::new();
            while batch.front().is_some_and(|job| job.turn == turn)
                && let Some(job) = batch.pop_front()
            {
                groups.push(vec![job]);
            }
            return Some(Plan { turn, groups });
        }
        let (mut raising, mut later) = (Vec::new(), Vec::new());
        let (mut alongside, mut pipelined) = (Vec::new(), Vec::new());
        let (mut calls, mut adds) = (BTreeSet::new(), Held::default());
        while batch
            .front()
            .is_some_and(|job| matches!(job.turn, Turn::Alongside | Turn::RaisingAlongside))
            && let Some(job) = batch.pop_front()
        {
            if job.turn == Turn::RaisingAlongside {
                let fits = job.raised.calls.iter().all(|call| !calls.contains(call))
                    && !adds.plus(job.raised.adds).exceeds(&RAISED_ALONGSIDE);
                if fits {
                    calls.extend(job.raised.calls.iter().cloned());
                    adds = adds.plus(job.raised.adds);
                    raising.push(job);
                } else {
                    later.push(job);
                }
            } else if job.principals.is_empty() {
                pipelined.push(job);
            } else {
                alongside.push(std::mem::take(&mut pipelined));
                alongside.push(vec![job]);
            }
        }
        let groups = std::iter::once(raising)
            .chain(alongside)
            .chain([pipelined])
            .filter(|group| !group.is_empty())
            .collect();
        for job in later.into_iter().rev() {
            batch.push_front(job);
        }
        Some(Plan { turn, groups })
    }

    /// The plan's one change, when it has only one.
    pub(super) fn only(&self) -> Option<&Job> {
        match self.groups.as_slice() {
            [group] => match group.as_slice() {
                [job] => Some(job),
                _ => None,
            },
            _ => None,
        }
    }

    /// What begins the transaction, taking the locks its changes' turns need: the raising lock, then the
    /// principals' locks in the order of their keys, the same order in every transaction, before
    /// anything else the transaction waits for, so that two transactions never each hold one the other waits
    /// for.
    pub(super) fn begin(&self) -> String {
        let jobs = || self.groups.iter().flatten();
        let mut begin = vec!["BEGIN".to_owned()];
        match self.turn {
            Turn::Alongside | Turn::RaisingAlongside => {
                if jobs().any(|job| job.turn == Turn::RaisingAlongside) {
                    begin.push(format!("SELECT pg_advisory_xact_lock_shared({RAISE_LOCK})"));
                }
                let keys: BTreeSet<i32> = jobs()
                    .flat_map(|job| &job.principals)
                    .map(|principal| principal_key(principal))
                    .collect();
                begin.extend(keys.into_iter().map(principal_lock));
            }
            Turn::RaisingAlone => begin.push(format!("SELECT pg_advisory_xact_lock({RAISE_LOCK})")),
            Turn::Apart => {}
        }
        begin.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::super::Failed;
    use super::*;
    use crate::ids::CallId;
    use crate::store::postgres::tx::Raised;

    /// A change that is never run, told apart by `tag`.
    fn job(turn: Turn, principals: &[&str], calls: &[&CallId], count: usize, tag: usize) -> Job {
        Job {
            change: Box::new(|_| Box::pin(async { Err(Failed::Told) })),
            turn,
            principals: principals.iter().map(|principal| principal.to_string()).collect(),
            raised: Raised {
                calls: calls.iter().map(|call| (*call).clone()).collect(),
                adds: Held { count, bytes: tag },
            },
            may_end: true,
        }
    }

    fn tags<'j>(jobs: impl IntoIterator<Item = &'j Job>) -> Vec<usize> {
        jobs.into_iter().map(|job| job.raised.adds.bytes).collect()
    }

    #[test]
    fn a_transaction_takes_one_group_of_raises_then_the_changes_alongside_in_order() {
        let (one, two) = (CallId::mint(), CallId::mint());
        let mut batch = VecDeque::from([
            job(Turn::Alongside, &[], &[], 0, 1),
            job(Turn::RaisingAlongside, &[], &[&one], 1, 2),
            job(Turn::Alongside, &[], &[], 0, 3),
            job(Turn::Alongside, &["zoe"], &[], 0, 4),
            // It locks a call the raise before it locks.
            job(Turn::RaisingAlongside, &[], &[&one, &two], 1, 5),
            job(Turn::RaisingAlongside, &[], &[&two], 1, 6),
            // Beyond what a transaction raising alongside others may raise.
            job(Turn::RaisingAlongside, &[], &[], RAISED_ALONGSIDE.count, 7),
            job(Turn::Alongside, &[], &[], 0, 8),
            job(Turn::Apart, &[], &[], 0, 9),
            job(Turn::Alongside, &[], &[], 0, 10),
        ]);
        let plan = Plan::take(&mut batch).unwrap();
        let groups: Vec<Vec<usize>> = plan.groups.iter().map(tags).collect();
        assert_eq!(groups, [vec![2, 6], vec![1, 3], vec![4], vec![8]]);
        assert_eq!(tags(&batch), [5, 7, 9, 10]);
        assert_eq!(
            plan.begin(),
            format!(
                "BEGIN; SELECT pg_advisory_xact_lock_shared({RAISE_LOCK}); {}",
                principal_lock(principal_key("zoe"))
            )
        );
        // Those left: the raise that waited first, alone in its plan.
        let plan = Plan::take(&mut batch).unwrap();
        assert_eq!(plan.groups.iter().map(tags).collect::<Vec<_>>(), [vec![5]]);
        assert_eq!(tags(&batch), [7, 9, 10]);
        let plan = Plan::take(&mut batch).unwrap();
        assert_eq!(plan.groups.iter().map(tags).collect::<Vec<_>>(), [vec![7]]);
        let plan = Plan::take(&mut batch).unwrap();
        assert_eq!(plan.groups.iter().map(tags).collect::<Vec<_>>(), [vec![9]]);
        assert_eq!(plan.begin(), "BEGIN");
    }

    #[test]
    fn a_transaction_without_raises_leaves_the_raising_lock_alone() {
        let mut batch = VecDeque::from([
            job(Turn::Alongside, &["zoe"], &[], 0, 1),
            job(Turn::Alongside, &["ann", "zoe"], &[], 0, 2),
            job(Turn::Alongside, &["bob"], &[], 0, 3),
        ]);
        let plan = Plan::take(&mut batch).unwrap();
        let mut keys: Vec<i32> = ["ann", "bob", "zoe"].map(principal_key).to_vec();
        keys.sort_unstable();
        let locks: Vec<String> = keys.into_iter().map(principal_lock).collect();
        assert_eq!(plan.begin(), format!("BEGIN; {}", locks.join("; ")));
    }

    #[test]
    fn no_lock_is_taken_by_every_transaction() {
        let begin = |turn| {
            Plan::take(&mut VecDeque::from([job(turn, &[], &[], 1, 1)]))
                .unwrap()
                .begin()
        };
        assert_eq!(begin(Turn::Alongside), "BEGIN");
        assert_eq!(begin(Turn::Apart), "BEGIN");
        assert_eq!(
            begin(Turn::RaisingAlongside),
            format!("BEGIN; SELECT pg_advisory_xact_lock_shared({RAISE_LOCK})")
        );
        assert_eq!(
            begin(Turn::RaisingAlone),
            format!("BEGIN; SELECT pg_advisory_xact_lock({RAISE_LOCK})")
        );
    }
}
