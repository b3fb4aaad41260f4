//! One re-ranking round of a vector search over generations whose vectors stay in their
//! objects, and small generations that hold theirs and scan their codes: every such arm
//! proposes the candidates its graph found (a walk's list, or the best by a scan of the codes,
//! at most as many as the round re-ranks), keyed by the 8-bit codes, and the query reads (or,
//! held, takes) the exact vectors of the best [`crate::Settings::vector_rerank`] (at least
//! offset + k) candidates of all arms together, not that many per arm. The codes' keys
//! estimate the same function of the query and a row in every generation (`-q·x` over unit
//! rows for `cosine`, `|x|² - 2 q·x` for `l2`, `-q·x` for `dot`), so candidates of different
//! generations compare.
//!
//! A cold query over 14 generations of a 2,000,000-row index read 1,400 vectors (1,567
//! requests, 25.7 MB through 16 KiB blocks) with 100 per arm; with 100 over all arms it reads
//! about a tenth of that, and the distances it returns stay exact.
//!
//! The round waits for every arm given a ticket before the plan sealed it: an arm that
//! re-ranks every admitted row instead (no graph, a walk or a scan of codes that came back
//! short) abstains, and an arm that never proposes (its work failed or never ran) abstains
//! when its [`Ticket`] drops with the plan. DataFusion's merge starts every arm of the plan
//! it runs at once, and a leaf that gathers its arms runs every one of them before it waits
//! for what any has left to do, so no arm waits for one that has not started.

use futures::future::BoxFuture;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// A candidate in the round: its codes' key, its arm, its row (ordered by key, ties by arm
/// and row, so the choice does not depend on which arm proposed first).
type Candidate = (f32, u32, u32);

fn order(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2))
}

/// What the round chose: every candidate, or those ordered at or before the last chosen one.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Choice {
    All,
    UpTo(Candidate),
}

#[derive(Debug, Default)]
struct State {
    /// Per arm given a ticket, whether it has proposed or abstained.
    arrived: Vec<bool>,
    /// Arms that have not arrived.
    waiting: usize,
    /// No more tickets are given: the round chooses once every arm has arrived.
    sealed: bool,
    /// The candidates proposed that may still be chosen: at most twice the budget, the rest
    /// dropped as they come ([`RerankRound::bar`]).
    proposed: Vec<Candidate>,
    /// Whether candidates were dropped: the round then chooses up to its last, even when it
    /// holds no more than its budget.
    trimmed: bool,
}

/// [`RerankRound::bar`] before any candidate was dropped.
const NO_BAR: u64 = u64::MAX;

/// The candidates of one vector search's arms, chosen together.
#[derive(Debug)]
pub(crate) struct RerankRound {
    budget: usize,
    state: Mutex<State>,
    choice: watch::Sender<Option<Choice>>,
    /// The key of the budget-th best candidate at the round's last trim (its f32 bits; the
    /// round trims once twice its budget was proposed, and again each time it holds twice
    /// its budget): no candidate with a greater key can be chosen, since at least the budget
    /// already order before it, so arms that scan after it need not propose one ([`NO_BAR`]
    /// before the first trim). Each trim's bar is at most the one before.
    bar: AtomicU64,
}

impl RerankRound {
    /// A round that re-ranks `budget` candidates in all, of the arms given a
    /// [`RerankRound::ticket`] before it is [sealed](RerankRound::seal).
    pub(crate) fn new(budget: usize) -> Arc<RerankRound> {
        Arc::new(RerankRound {
            budget: budget.max(1),
            state: Mutex::new(State::default()),
            choice: watch::channel(None).0,
            bar: AtomicU64::new(NO_BAR),
        })
    }

    /// How many candidates the round re-ranks in all: no arm's best past that many is chosen.
    pub(crate) fn budget(&self) -> usize {
        self.budget
    }

    /// A place in the round for one more arm, which abstains for it when dropped unused.
    pub(crate) fn ticket(self: &Arc<Self>) -> Ticket {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let arm = s.arrived.len();
        if !s.sealed {
            s.arrived.push(false);
            s.waiting += 1;
        }
        Ticket {
            round: self.clone(),
            arm,
        }
    }

    /// No more arms: the round chooses once those with a ticket have arrived (at once if
    /// they all have).
    pub(crate) fn seal(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.sealed = true;
        self.choose_if_done(s);
    }

    /// Arm `arm` proposes `keyed` (`(key, row)`); the last arm to arrive makes the choice. An
    /// arm arrives once: what it proposes again (a plan executed twice) is ignored.
    fn arrive(&self, arm: usize, keyed: &[(f32, usize)]) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match s.arrived.get(arm) {
            Some(false) => s.arrived[arm] = true,
            _ => return,
        }
        s.proposed.extend(
            keyed
                .iter()
                .map(|(key, row)| (*key, arm as u32, *row as u32)),
        );
        // Twice the budget proposed: only the best budget can be chosen, and the last of
        // them is the bar later arms scan below.
        if s.proposed.len() >= self.budget.saturating_mul(2) {
            let budget = self.budget;
            let (_, last, _) = s.proposed.select_nth_unstable_by(budget - 1, order);
            let bar = last.0;
            s.proposed.truncate(budget);
            s.trimmed = true;
            self.bar.store(u64::from(bar.to_bits()), Ordering::Relaxed);
        }
        s.waiting -= 1;
        self.choose_if_done(s);
    }

    /// The key no candidate proposed from now on can be chosen past (a greater key): none
    /// until twice the candidates the round re-ranks were proposed.
    pub(crate) fn bar(&self) -> Option<f32> {
        match self.bar.load(Ordering::Relaxed) {
            NO_BAR => None,
            bits => u32::try_from(bits).ok().map(f32::from_bits),
        }
    }

    /// Make the choice once the round is sealed and every arm has arrived.
    fn choose_if_done(&self, mut s: std::sync::MutexGuard<'_, State>) {
        if !s.sealed || s.waiting > 0 || self.choice.borrow().is_some() {
            return;
        }
        let mut all = std::mem::take(&mut s.proposed);
        let choice = if all.len() <= self.budget && !s.trimmed {
            Choice::All
        } else {
            let (_, last, _) = all.select_nth_unstable_by(self.budget - 1, order);
            Choice::UpTo(*last)
        };
        drop(s);
        self.choice.send_replace(Some(choice));
    }

    /// Once every arm has arrived: the rows of `keyed` (what arm `arm` proposed) the round
    /// chose, in their order.
    async fn chosen(&self, arm: usize, keyed: Vec<(f32, usize)>) -> Vec<usize> {
        let mut rx = self.choice.subscribe();
        // The sender lives as long as the round: waiting cannot fail.
        let choice = match rx.wait_for(Option::is_some).await {
            Ok(c) => (*c).unwrap_or(Choice::All),
            Err(_) => Choice::All,
        };
        keyed
            .into_iter()
            .filter(|(key, row)| match choice {
                Choice::All => true,
                Choice::UpTo(last) => order(&(*key, arm as u32, *row as u32), &last).is_le(),
            })
            .map(|(_, row)| row)
            .collect()
    }
}

/// An arm's place in a [`RerankRound`].
#[derive(Debug)]
pub(crate) struct Ticket {
    round: Arc<RerankRound>,
    arm: usize,
}

impl Ticket {
    /// Propose `keyed` (`(key, row)`, the arm's candidates) now; the future waits for the
    /// round: the rows of `keyed` chosen for exact re-ranking.
    pub(crate) fn propose(&self, keyed: Vec<(f32, usize)>) -> BoxFuture<'static, Vec<usize>> {
        self.round.arrive(self.arm, &keyed);
        let (round, arm) = (self.round.clone(), self.arm);
        Box::pin(async move { round.chosen(arm, keyed).await })
    }

    /// The round's bar ([`RerankRound::bar`]): a candidate with a greater key is never chosen.
    pub(crate) fn bar(&self) -> Option<f32> {
        self.round.bar()
    }

    /// Take no part in the round (the arm re-ranks rows of its own choosing, or failed).
    pub(crate) fn abstain(&self) {
        self.round.arrive(self.arm, &[]);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.abstain();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_best_candidates_of_all_arms_are_chosen() {
        let round = RerankRound::new(4);
        let (a, b, c) = (round.ticket(), round.ticket(), round.ticket());
        round.seal();
        let pa = tokio::spawn(a.propose(vec![(0.1, 7), (0.5, 8), (0.9, 9)]));
        let pb = tokio::spawn(b.propose(vec![(0.2, 1), (0.3, 2), (0.4, 3)]));
        tokio::task::yield_now().await;
        assert!(
            !pa.is_finished() && !pb.is_finished(),
            "they wait for arm 2"
        );
        // Arm 2 abstains by dropping its ticket.
        drop(c);
        assert_eq!(pa.await.unwrap(), vec![7]);
        assert_eq!(pb.await.unwrap(), vec![1, 2, 3]);
    }

    #[tokio::test]
    async fn ties_are_broken_by_arm_then_row_and_a_small_round_keeps_all() {
        let round = RerankRound::new(2);
        let (a, b) = (round.ticket(), round.ticket());
        round.seal();
        let pb = tokio::spawn(b.propose(vec![(0.5, 1), (0.5, 2)]));
        let got = a.propose(vec![(0.5, 9)]).await;
        assert_eq!(got, vec![9]);
        assert_eq!(pb.await.unwrap(), vec![1]);
        let round = RerankRound::new(10);
        let t = round.ticket();
        round.seal();
        assert_eq!(t.propose(vec![(3.0, 1), (1.0, 2)]).await, vec![1, 2]);
        // Proposing again changes nothing.
        assert_eq!(t.propose(vec![(3.0, 1), (1.0, 2)]).await, vec![1, 2]);
    }

    #[tokio::test]
    async fn a_bar_comes_at_twice_the_budget_and_changes_no_choice() {
        let round = RerankRound::new(2);
        let (a, b, c) = (round.ticket(), round.ticket(), round.ticket());
        round.seal();
        assert_eq!(a.bar(), None);
        let pa = tokio::spawn(a.propose(vec![(0.4, 1), (0.9, 2), (0.3, 3)]));
        assert_eq!(round.bar(), None, "three candidates, a budget of two");
        let pb = tokio::spawn(b.propose(vec![(0.5, 4)]));
        // Four proposed: the second best key is the bar. An arm that scanned below it
        // proposes what ties it, which orders after the same key of an earlier arm.
        assert_eq!(c.bar(), Some(0.4));
        assert_eq!(c.propose(vec![(0.4, 0)]).await, Vec::<usize>::new());
        assert_eq!(pa.await.unwrap(), vec![1, 3]);
        assert_eq!(pb.await.unwrap(), Vec::<usize>::new());
        // Candidates dropped: the round chooses up to its last, though it holds no more than
        // its budget.
        let round = RerankRound::new(2);
        let a = round.ticket();
        round.seal();
        let keyed = vec![(0.5, 1), (0.1, 2), (0.7, 3), (0.2, 4)];
        assert_eq!(a.propose(keyed).await, vec![2, 4]);
    }

    #[tokio::test]
    async fn arms_that_scan_below_the_bar_get_what_they_would_without_it() {
        // Arms arrive in many orders, each proposing its list cut at the bar it finds, as a
        // scan does; each gets what it would from a round that saw every list whole.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for trial in 0..200 {
            let budget = 1 + (next() % 6) as usize;
            let arms = 2 + (next() % 6) as usize;
            // Sorted lists of at most twice the budget, keys on a coarse grid (ties).
            let lists: Vec<Vec<(f32, usize)>> = (0..arms)
                .map(|_| {
                    let n = (next() % (2 * budget as u64 + 1)) as usize;
                    let mut l: Vec<(f32, usize)> =
                        (0..n).map(|r| ((next() % 8) as f32 / 4.0, r)).collect();
                    l.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                    l
                })
                .collect();
            let whole = RerankRound::new(budget);
            let whole_tickets: Vec<Ticket> = (0..arms).map(|_| whole.ticket()).collect();
            whole.seal();
            let cut = RerankRound::new(budget);
            let cut_tickets: Vec<Ticket> = (0..arms).map(|_| cut.ticket()).collect();
            cut.seal();
            let mut order: Vec<usize> = (0..arms).collect();
            for i in (1..arms).rev() {
                order.swap(i, (next() % (i as u64 + 1)) as usize);
            }
            let mut want = vec![Vec::new(); arms];
            let mut got = vec![Vec::new(); arms];
            let mut waits = Vec::new();
            for &a in &order {
                let bar = cut_tickets[a].bar();
                let below: Vec<(f32, usize)> = lists[a]
                    .iter()
                    .copied()
                    .filter(|(key, _)| bar.is_none_or(|b| key.total_cmp(&b).is_le()))
                    .collect();
                waits.push((a, cut_tickets[a].propose(below)));
            }
            let whole_waits: Vec<_> = whole_tickets
                .iter()
                .enumerate()
                .map(|(a, ticket)| ticket.propose(lists[a].clone()))
                .collect();
            for (a, wait) in whole_waits.into_iter().enumerate() {
                want[a] = wait.await;
            }
            for (a, wait) in waits {
                got[a] = wait.await;
            }
            assert_eq!(got, want, "trial {trial}: budget {budget}, order {order:?}");
        }
    }

    #[tokio::test]
    async fn the_round_waits_for_its_seal() {
        let round = RerankRound::new(1);
        let a = round.ticket();
        let pa = tokio::spawn(a.propose(vec![(0.5, 1), (0.1, 2)]));
        tokio::task::yield_now().await;
        assert!(
            !pa.is_finished(),
            "more arms may come until the round is sealed"
        );
        let b = round.ticket();
        round.seal();
        let pb = tokio::spawn(b.propose(vec![(0.2, 3)]));
        assert_eq!(pa.await.unwrap(), vec![2]);
        assert_eq!(pb.await.unwrap(), Vec::<usize>::new());
        // A round of no arm chooses when sealed.
        RerankRound::new(1).seal();
    }
}
