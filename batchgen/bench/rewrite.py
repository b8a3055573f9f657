"""B8's prompts: chat requests to copy or lightly edit a paragraph, the jobs where a completion repeats
long spans of its prompt (speculative decoding's case). Deterministic: paragraphs of 8-14 sentences
(about 200-400 tokens) drawn from a fixed list by a seeded generator, each with one of a few instructions."""

from __future__ import annotations

import random

SENTENCES = (
    "The river rises every spring when the snow melts in the northern hills.",
    "Farmers along its banks plant barley in April and harvest it before the autumn rains.",
    "The old mill at the bend was built in 1842 and still grinds flour for the village bakery.",
    "Children walk across the wooden bridge each morning on their way to the school.",
    "In summer the water runs low and clear, and herons fish in the shallow pools.",
    "The town council meets on the first Tuesday of every month in the library hall.",
    "Last year it approved a new budget for repairing the roads and the public swimming pool.",
    "Most residents agreed with the plan, although some wanted more money for the school.",
    "The library opens at nine o'clock and closes at six, except on Sundays.",
    "Its collection includes local history books, maps and photographs of the valley.",
    "Volunteers run a reading club for older people every Thursday afternoon.",
    "A small museum next to the station displays tools used by the first settlers.",
    "The railway reached the valley in 1901 and brought visitors from the city.",
    "Hotels and guest houses were built along the main street to welcome them.",
    "Today tourism is the largest source of income for the families who live here.",
    "Walkers come to climb the ridge, which offers a view of three lakes on a clear day.",
    "The path to the top takes about four hours and is marked with red and white signs.",
    "Mountain huts provide shelter, hot meals and beds for those who stay overnight.",
    "Weather in the hills can change quickly, so walkers should carry warm clothes and water.",
    "The local rescue team trains every weekend and answers around forty calls a year.",
    "Cheese from the valley is sold in markets across the country.",
    "It is made from the milk of cows that graze on the high pastures during the summer.",
    "The cheese is aged for at least six months in cool cellars under the farmhouses.",
    "A festival in October celebrates the return of the herds from the mountains.",
    "Musicians play in the square, and the cows are decorated with flowers and bells.",
    "The church on the hill was rebuilt after a fire destroyed the roof in 1923.",
    "Its bell tower can be seen from every farm in the valley.",
    "Concerts are held inside during the summer because of the excellent acoustics.",
    "The nearest hospital is in the city, about an hour away by car.",
    "A doctor visits the village clinic twice a week to see patients.",
    "Plans for a new bus line would connect the valley to the city every two hours.",
    "Supporters say the line would help older residents and students who do not drive.",
    "The project depends on funding from the regional government, expected next spring.",
    "Engineers have already surveyed the road and suggested widening two narrow curves.",
    "Construction could begin within a year if the funding is approved on time.",
    "Meanwhile, a shared taxi service carries passengers to the station on weekdays.",
    "Bookings must be made by phone at least one day before the trip.",
    "The service is popular and often full on Monday mornings.",
    "A new bakery opened last month and already has a queue every Saturday.",
    "It sells bread made with flour from the old mill and honey from local farms.",
)
INSTRUCTIONS = (
    "Copy the following paragraph exactly, word for word. Reply with the paragraph only.",
    "Rewrite the following paragraph, correcting any spelling mistakes but otherwise keeping it unchanged. "
    "Reply with the paragraph only.",
    "Repeat the paragraph below without changing anything. Reply with the paragraph only.",
    "Lightly edit the following paragraph for clarity, keeping every sentence. "
    "Reply with the paragraph only.",
)


def rewrite_messages(
    count: int, seed: int = 0, sentences: tuple[int, int] = (8, 14)
) -> list[list[dict[str, str]]]:
    """``count`` chat conversations, each one user message: an instruction and a paragraph of
    ``sentences`` (fewest, most) sentences."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        paragraph = " ".join(rng.sample(SENTENCES, rng.randint(*sentences)))
        rows.append([{"role": "user", "content": f"{INSTRUCTIONS[i % len(INSTRUCTIONS)]}\n\n{paragraph}"}])
    return rows
