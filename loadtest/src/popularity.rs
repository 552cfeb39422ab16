//! Entity popularity over days: where TopViews-shaped traffic comes from.
//!
//! Two sources: a Wikipedia TopViews-style CSV (`date,article,views`) for the entities it
//! lists, continued by the built-in model for the rest (see [`views_then_model`]); or the
//! built-in model alone: each day the entities are ranked and drawn by Zipf(s) over rank; the ranking is reshuffled
//! daily by a log-normal jitter of every entity's base popularity, and on some days one
//! entity from outside the top ten trends to rank one for that day. Everything is seeded.

use display_full_error::DisplayFullErrorExt;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

/// Parameters of the built-in popularity model. See `loadtest/README.md` for why the
/// defaults are what they are.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ZipfModel {
    /// Zipf exponent over the day's ranking.
    pub exponent: f64,
    /// Days the workload spans; queries are spread evenly over them.
    pub days: usize,
    /// Standard deviation of the daily log-normal jitter of base popularity (0: a fixed ranking).
    pub daily_jitter: f64,
    /// Chance per day that an entity from outside the top ten trends to rank one.
    pub burst_probability: f64,
    pub seed: u64,
}

impl Default for ZipfModel {
    fn default() -> Self {
        Self {
            exponent: 1.0,
            days: 7,
            daily_jitter: 0.5,
            burst_probability: 0.3,
            seed: 7,
        }
    }
}

/// Per day, the entities (indexes into the caller's entity list) with their draw weights.
#[derive(Clone, Debug, PartialEq)]
pub struct DailyPopularity {
    pub days: Vec<Vec<(usize, f64)>>,
    /// Per day, the entities whose weight comes from real page views (the rest: the model).
    pub observed: Vec<HashSet<usize>>,
}

#[derive(Debug, thiserror::Error)]
pub enum PopularityError {
    #[error("cannot read {path}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Format {
        path: String,
        line: usize,
        message: String,
    },
    #[error("no article in {0} matches an entity with questions")]
    NoMatch(String),
    #[error("invalid popularity model: {0}")]
    Invalid(String),
}

impl ZipfModel {
    /// Daily rankings of `entities` entities under the model.
    pub fn daily(&self, entities: usize) -> Result<DailyPopularity, PopularityError> {
        if entities == 0 || self.days == 0 {
            return Err(PopularityError::Invalid(
                "needs at least one entity and one day".into(),
            ));
        }
        if !(self.exponent.is_finite() && self.exponent >= 0.0) {
            return Err(PopularityError::Invalid(format!(
                "exponent {} must be finite and >= 0",
                self.exponent
            )));
        }
        if !(0.0..=1.0).contains(&self.burst_probability) {
            return Err(PopularityError::Invalid(
                "burst probability must be in [0, 1]".into(),
            ));
        }
        let jitter = Normal::new(0.0, self.daily_jitter.max(0.0))
            .map_err(|e| PopularityError::Invalid(e.to_string_full()))?;
        let mut rng = StdRng::seed_from_u64(self.seed);
        let mut base: Vec<usize> = (0..entities).collect();
        base.shuffle(&mut rng);
        // Base popularity of the entity at base rank r (1-based) is r^-s.
        let log_base: Vec<f64> = (0..entities)
            .map(|r| -self.exponent * ((r + 1) as f64).ln())
            .collect();
        let mut days = Vec::with_capacity(self.days);
        for _ in 0..self.days {
            let mut ranked: Vec<(usize, f64)> = base
                .iter()
                .zip(&log_base)
                .map(|(&e, &lb)| (e, lb + jitter.sample(&mut rng)))
                .collect();
            ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
            if entities > 10 && rng.random_bool(self.burst_probability) {
                let trending = ranked.remove(rng.random_range(10..entities));
                ranked.insert(0, trending);
            }
            days.push(
                ranked
                    .iter()
                    .enumerate()
                    .map(|(rank, &(e, _))| (e, ((rank + 1) as f64).powf(-self.exponent)))
                    .collect(),
            );
        }
        Ok(DailyPopularity {
            observed: vec![HashSet::new(); days.len()],
            days,
        })
    }
}

/// TopViews exports name articles with underscores (`Super_Bowl_50`); entities use spaces.
fn article_key(article: &str) -> String {
    article.trim().trim_matches('"').replace('_', " ")
}

/// One day of a TopViews export, matched against the entities.
#[derive(Clone, Debug, PartialEq)]
pub struct TopViewsDay {
    /// Entities (indexes into the caller's list) listed that day, with their views.
    pub matched: Vec<(usize, f64)>,
    /// Articles listed that day, matched or not.
    pub listed: usize,
    /// Fewest views of an article listed that day: an article left off had fewer.
    pub min_views: f64,
}

/// Reads a TopViews-style CSV (`date,article,views`, header optional, one row per article
/// and day; gzipped or not), in date order. Articles are matched to `entities` by title.
pub fn read_topviews(
    path: &Path,
    entities: &[String],
) -> Result<Vec<TopViewsDay>, PopularityError> {
    let shown = path.display().to_string();
    let text = hasten_core::corpus::read_text(path).map_err(|source| PopularityError::Io {
        path: shown.clone(),
        source,
    })?;
    let index: BTreeMap<String, usize> = entities
        .iter()
        .enumerate()
        .map(|(i, e)| (article_key(e), i))
        .collect();
    let format_error = |line: usize, message: String| PopularityError::Format {
        path: shown.clone(),
        line,
        message,
    };
    let mut by_date: BTreeMap<String, TopViewsDay> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let (rest, views) = line
            .rsplit_once(',')
            .ok_or_else(|| format_error(i + 1, "expected date,article,views".into()))?;
        let (date, article) = rest
            .split_once(',')
            .ok_or_else(|| format_error(i + 1, "expected date,article,views".into()))?;
        let views: f64 = match views.trim().parse() {
            Ok(v) => v,
            Err(_) if i == 0 => continue, // header
            Err(_) => {
                return Err(format_error(
                    i + 1,
                    format!("views {views:?} is not a number"),
                ));
            }
        };
        if !(views.is_finite() && views > 0.0) {
            continue;
        }
        let day = by_date
            .entry(date.trim().to_string())
            .or_insert(TopViewsDay {
                matched: Vec::new(),
                listed: 0,
                min_views: f64::INFINITY,
            });
        day.listed += 1;
        day.min_views = day.min_views.min(views);
        if let Some(&entity) = index.get(&article_key(article)) {
            day.matched.push((entity, views));
        }
    }
    if by_date.values().all(|day| day.matched.is_empty()) {
        return Err(PopularityError::NoMatch(shown));
    }
    Ok(by_date.into_values().collect())
}

/// Popularity from real page views where an entity appears in them, else the model.
///
/// A day's listed entities weigh their views. The export lists only the day's most viewed
/// pages, so the entities it leaves off form the tail below its last listed rank: they are
/// ranked by `model` (its own ranking for that day) and continue the real curve as Zipf
/// from there, the entity at tail rank r weighing `min_views * (listed / (listed + r))^s`.
/// The model spans the export's days.
pub fn views_then_model(
    views: &[TopViewsDay],
    model: &ZipfModel,
    entities: usize,
) -> Result<DailyPopularity, PopularityError> {
    let ranking = ZipfModel {
        days: views.len(),
        ..model.clone()
    }
    .daily(entities)?;
    let mut days = Vec::with_capacity(views.len());
    let mut observed = Vec::with_capacity(views.len());
    for (day, ranked) in views.iter().zip(&ranking.days) {
        let listed: HashSet<usize> = day.matched.iter().map(|(e, _)| *e).collect();
        let mut weights = day.matched.clone();
        let anchor = day.listed as f64;
        weights.extend(
            ranked
                .iter()
                .filter(|(e, _)| !listed.contains(e))
                .enumerate()
                .map(|(r, &(e, _))| {
                    let tail_rank = (r + 1) as f64;
                    (
                        e,
                        day.min_views * (anchor / (anchor + tail_rank)).powf(model.exponent),
                    )
                }),
        );
        days.push(weights);
        observed.push(listed);
    }
    Ok(DailyPopularity { days, observed })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Least-squares slope of log(frequency) against log(rank) over the top `ranks` ranks.
    fn rank_frequency_slope(counts: &[usize], ranks: usize) -> f64 {
        let mut sorted: Vec<usize> = counts.to_vec();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let points: Vec<(f64, f64)> = sorted
            .iter()
            .take(ranks)
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(r, &c)| (((r + 1) as f64).ln(), (c as f64).ln()))
            .collect();
        let n = points.len() as f64;
        let (sx, sy) = points
            .iter()
            .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
        let (mx, my) = (sx / n, sy / n);
        let cov: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
        let var: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
        cov / var
    }

    fn draw_day(day: &[(usize, f64)], entities: usize, draws: usize, seed: u64) -> Vec<usize> {
        let total: f64 = day.iter().map(|(_, w)| w).sum();
        let mut rng = StdRng::seed_from_u64(seed);
        let mut counts = vec![0usize; entities];
        for _ in 0..draws {
            let mut x = rng.random::<f64>() * total;
            for &(e, w) in day {
                if x < w {
                    counts[e] += 1;
                    break;
                }
                x -= w;
            }
        }
        counts
    }

    #[test]
    fn seeded_and_reproducible() {
        let model = ZipfModel::default();
        assert_eq!(model.daily(50).unwrap(), model.daily(50).unwrap());
        let other = ZipfModel {
            seed: 8,
            ..ZipfModel::default()
        };
        assert_ne!(model.daily(50).unwrap(), other.daily(50).unwrap());
    }

    #[test]
    fn rank_frequency_slope_is_near_the_exponent() {
        for exponent in [0.8, 1.0, 1.2] {
            let model = ZipfModel {
                exponent,
                days: 1,
                burst_probability: 0.0,
                ..ZipfModel::default()
            };
            let day = &model.daily(2000).unwrap().days[0];
            let counts = draw_day(day, 2000, 200_000, 1);
            let slope = rank_frequency_slope(&counts, 100);
            assert!(
                (slope + exponent).abs() < 0.1,
                "s = {exponent}: slope {slope}"
            );
        }
    }

    #[test]
    fn rankings_change_daily_and_bursts_reach_the_top() {
        let model = ZipfModel {
            days: 20,
            burst_probability: 1.0,
            ..ZipfModel::default()
        };
        let days = model.daily(100).unwrap().days;
        let tops: std::collections::HashSet<usize> = days.iter().map(|d| d[0].0).collect();
        assert!(tops.len() > 5, "the top entity never changes: {tops:?}");
        let still = ZipfModel {
            days: 5,
            daily_jitter: 0.0,
            burst_probability: 0.0,
            ..ZipfModel::default()
        };
        let fixed = still.daily(100).unwrap().days;
        assert!(
            fixed.windows(2).all(|w| w[0] == w[1]),
            "no jitter, no bursts: one ranking"
        );
    }

    #[test]
    fn topviews_days_map_articles_to_entities_and_keep_the_list_floor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("topviews.csv");
        std::fs::write(
            &path,
            "date,article,views\n2026-01-01,Super_Bowl_50,900\n2026-01-01,Unknown_Article,5000\n\
             2026-01-01,Warsaw,100\n2026-01-02,Warsaw,300\n",
        )
        .unwrap();
        let entities = vec!["Warsaw".to_string(), "Super Bowl 50".to_string()];
        let days = read_topviews(&path, &entities).unwrap();
        assert_eq!(days.len(), 2);
        assert_eq!(days[0].matched, vec![(1, 900.0), (0, 100.0)]);
        assert_eq!((days[0].listed, days[0].min_views), (3, 100.0));
        assert_eq!(days[1].matched, vec![(0, 300.0)]);
        std::fs::write(&path, "2026-01-01,Warsaw,1\n2026-01-01,Warsaw,many\n").unwrap();
        assert!(matches!(
            read_topviews(&path, &entities),
            Err(PopularityError::Format { line: 2, .. })
        ));
        std::fs::write(&path, "2026-01-01,Nothing,1\n").unwrap();
        assert!(matches!(
            read_topviews(&path, &entities),
            Err(PopularityError::NoMatch(_))
        ));
    }

    #[test]
    fn unlisted_entities_continue_the_real_curve_below_its_floor() {
        let views = vec![
            TopViewsDay {
                matched: vec![(0, 5000.0), (3, 200.0)],
                listed: 10,
                min_views: 100.0,
            },
            TopViewsDay {
                matched: vec![(3, 800.0)],
                listed: 10,
                min_views: 50.0,
            },
        ];
        let model = ZipfModel::default();
        let popularity = views_then_model(&views, &model, 6).unwrap();
        assert_eq!(popularity.days.len(), 2);
        assert_eq!(popularity.observed[0], HashSet::from([0, 3]));
        assert_eq!(popularity.observed[1], HashSet::from([3]));
        for (day, listed) in popularity.days.iter().zip(&views) {
            // Every entity once: the listed with their views, the rest below the floor,
            // decreasing along the model's ranking.
            let mut seen: Vec<usize> = day.iter().map(|(e, _)| *e).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..6).collect::<Vec<_>>());
            let tail: Vec<f64> = day[listed.matched.len()..]
                .iter()
                .map(|(_, w)| *w)
                .collect();
            assert!(tail.iter().all(|w| *w < listed.min_views), "{tail:?}");
            assert!(tail.windows(2).all(|w| w[0] > w[1]), "{tail:?}");
            assert!((tail[0] - listed.min_views * 10.0 / 11.0).abs() < 1e-9);
        }
        assert_eq!(&popularity.days[1][..1], &[(3, 800.0)]);
    }
}
